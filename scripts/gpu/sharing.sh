#!/usr/bin/env bash
# GPU sharing measured (issue 18, MuxFlow's time-slicing and MPS rules): an online service at
# a low duty cycle beside an offline training job, by time slicing and by MPS at several SM
# limits for the offline job, against each alone. Prints RESULT lines; the simulator's
# constants these inform are in host/sim/src/models/muxflow/truth.rs (docs/gpu-validation.md).
# Usage: scripts/gpu/sharing.sh [SECONDS] [THINK_MS]   (defaults 8 and 3.5: a request of 32
#        1024^2 matmuls takes about 1.2 ms alone on an H200, so the service is busy ~26 % of
#        the time, the production average MuxFlow §7.5 reports)
# Env:   SERVICE_N (the service's matmul size, default 1024), MPS_ONLY=1 (only the MPS runs
#        with the offline job at 50 and 25 %, and the service alone under MPS).
# Needs: an NVIDIA GPU, python3 with torch, nvidia-cuda-mps-control (for the MPS part).
set -uo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
SECS="${1:-8}"; THINK="${2:-3.5}"
WORK="$(mktemp -d /tmp/arbiter-sharing.XXXXXX)"
export CUDA_MPS_PIPE_DIRECTORY="$WORK/pipe" CUDA_MPS_LOG_DIRECTORY="$WORK/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
cleanup() { echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
# A window that starts once both sides have warmed up (CUDA init, cuBLAS handles).
window() { "$PY" -c "import time; s = time.time(); print(s + 6, s + 6 + $SECS)"; }
run() { # label, then "service" and/or "offline" with env prefixes
  local label="$1" svc_env="$2" off_env="$3" w start end out_s out_o
  w=$(window); start=${w% *}; end=${w#* }
  out_s=""; out_o=""
  if [ "$off_env" != none ]; then env $off_env "$PY" "$DIR/sharing.py" offline "$start" "$end" > "$WORK/o" 2>&1 & fi
  if [ "$svc_env" != none ]; then env $svc_env "$PY" "$DIR/sharing.py" service "$start" "$end" "$THINK" > "$WORK/s" 2>&1 & fi
  wait
  [ "$svc_env" != none ] && out_s=$(tail -1 "$WORK/s")
  [ "$off_env" != none ] && out_o=$(tail -1 "$WORK/o")
  echo "RESULT $label service: ${out_s:--} offline: ${out_o:--}"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "service: 32 x ${SERVICE_N:-1024}^2 matmuls per request, ${THINK} ms idle after each"
if [ -z "${MPS_ONLY:-}" ]; then
  run "service alone" "X=1" none
  run "offline alone" none "X=1"
  run "time slicing" "X=1" "X=1"
fi
nvidia-cuda-mps-control -d || { echo "no MPS"; exit 1; }
PCTS="100 50 25"; [ -n "${MPS_ONLY:-}" ] && PCTS="50 25"
for P in $PCTS; do
  [ -z "${MPS_ONLY:-}" ] && run "mps offline alone at $P%" none "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$P"
  run "mps pair, offline at $P%" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$P"
done
run "mps service alone" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" none
