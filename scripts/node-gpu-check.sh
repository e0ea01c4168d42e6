#!/usr/bin/env bash
# Runs the node's NVML backend (and its MPS manager, if nvidia-cuda-mps-control is installed)
# against the real GPUs of this machine and prints what it sees: driver, GPUs, utilization,
# memory, SM clocks, throttle reasons, compute and MPS processes with per-process utilization,
# compute mode; then a private MPS control daemon on GPU 0 (own pipe/log dirs, so an MPS setup
# already running is untouched): default active thread percentage, set/get, server list, quit.
#
# Usage: scripts/node-gpu-check.sh [gpu_check options]
#   e.g. scripts/node-gpu-check.sh --samples 5 --interval-ms 1000
#        scripts/node-gpu-check.sh --no-mps
#        scripts/node-gpu-check.sh --nvml-lib /path/to/libnvidia-ml.so.1
#        scripts/node-gpu-check.sh --mps-client "python3 scripts/gpu/matmul_bench.py 5"
#          (throughput of a real client under the private daemon at 100 % and 25 % of the SMs)
#        scripts/node-gpu-check.sh --mps-client "python3 scripts/gpu/matmul_bench.py 8" \
#            --mps-fault "python3 scripts/gpu/fault.py"
#          (a client faults beside that one; health is polled; the enforcer's restart; a fresh client)
# Needs: an NVIDIA driver (libnvidia-ml.so.1), cargo — or GPU_CHECK=/path/to/a/built/gpu_check.
# Run a GPU job meanwhile (e.g. a PyTorch loop) to see processes and per-process utilization.
# Exit status: that of gpu_check.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

echo "== nvidia-smi (for comparison)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total,clocks.sm,clocks.max.sm,compute_mode \
        --format=csv || true
else
    echo "nvidia-smi not found"
fi

if [ -n "${GPU_CHECK:-}" ]; then
    exec "$GPU_CHECK" "$@"
fi
exec cargo run --quiet -p arbiter-node --example gpu_check -- "$@"
