#!/usr/bin/env bash
# The interposer in front of the REAL CUDA runtime and the REAL user-mode driver, on a machine
# without a GPU (CI): proves that every driver entry point the runtime looks up and that we
# wrap is handed out as our wrapper, and that cuInit goes through us.
#
#   scripts/real-cuda-check.sh [libarbiter_interpose.so]   (default: scripts/build-interposer.sh)
#
# Needs a Debian host (deb822 apt sources; Debian's `libcuda1` package) — CI's machines are.
# Fetched, never installed, into target/real-cuda (or $ARBITER_REAL_CUDA_DIR):
#  * the runtime: `nvidia-cuda-runtime-cu12` 12.9 and `-cu11` 11.8 wheels from PyPI (shared
#    libcudart; 12.x resolves through cuGetProcAddress_v2, 11.x through the v1 ABI);
#  * the driver: Debian's `libcuda1` from bookworm's non-free component — the machine's own apt
#    sources with `non-free` added on their Components line, in a private apt state directory,
#    `apt-get download` + `dpkg -x` (installing it would pull in the kernel module).
# With no GPU, the real driver answers cuInit with 100 (no device): enough to see the loading
# path. The interposer's resolution trace (ARBITER_INTERPOSE_TRACE) names the driver's answer
# to each lookup with dladdr; the wrapped set is read from the .so's own exports, so neither
# side of the comparison comes from the interposer's internal table.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SO="${1:-$(bash "$ROOT/scripts/build-interposer.sh")}"
WORK="${ARBITER_REAL_CUDA_DIR:-$ROOT/target/real-cuda}"
mkdir -p "$WORK"
fail() { echo "real-cuda-check: FAIL: $*" >&2; exit 1; }

echo "== the CUDA runtime (PyPI wheels)"
for spec in 'nvidia-cuda-runtime-cu12==12.9.79' 'nvidia-cuda-runtime-cu11==11.8.89'; do
  name="${spec%%==*}"
  if [ ! -d "$WORK/$name" ]; then
    rm -rf "$WORK/wheel" && mkdir -p "$WORK/wheel"
    python3 -m pip download -q --no-deps "$spec" -d "$WORK/wheel"
    python3 -m zipfile -e "$WORK"/wheel/*.whl "$WORK/$name"
  fi
done
CUDART12="$(find "$WORK/nvidia-cuda-runtime-cu12" -name 'libcudart.so.12' | head -n 1)"
CUDART11="$(find "$WORK/nvidia-cuda-runtime-cu11" -name 'libcudart.so.11.0' | head -n 1)"
[ -n "$CUDART12" ] && [ -n "$CUDART11" ] || fail "libcudart not found in the wheels"

echo "== the user-mode driver (Debian non-free libcuda1, extracted)"
DRIVER="$WORK/driver/usr/lib/x86_64-linux-gnu/nvidia/current"
if [ ! -f "$DRIVER/libcuda.so.1" ]; then
  APT="$WORK/apt"
  rm -rf "$APT" && mkdir -p "$APT/parts" "$APT/lists/partial" "$APT/cache/archives/partial"
  sources=(/etc/apt/sources.list.d/*.sources)
  [ -e "${sources[0]}" ] || fail "no deb822 apt sources under /etc/apt/sources.list.d"
  for f in "${sources[@]}"; do
    # non-free on every Components line that lacks it.
    sed -E '/^Components:/{/[[:space:]]non-free([[:space:]]|$)/!s/$/ non-free/}' "$f" \
      > "$APT/parts/$(basename "$f")"
  done
  opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APT/parts"
        -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "APT::Sandbox::User=root")
  apt-get "${opts[@]}" update -qq
  (cd "$APT" && apt-get "${opts[@]}" download libcuda1 >/dev/null)
  dpkg -x "$APT"/libcuda1_*.deb "$WORK/driver"
fi
[ -f "$DRIVER/libcuda.so.1" ] || fail "libcuda.so.1 not in the libcuda1 package"
echo "driver: $(basename "$(readlink -f "$DRIVER/libcuda.so.1")")"

echo "== the probe"
cc -O1 -Wall -o "$WORK/cudart_probe" "$ROOT/tests/cuda-workload/c/cudart_probe.c" -ldl

objdump -T "$SO" | awk '$4 == ".text" && $NF ~ /^cu/ {print $NF}' | sort -u > "$WORK/wrapped"
[ "$(wc -l < "$WORK/wrapped")" -ge 30 ] || fail "the interposer exports too few cu* entry points"

check() { # runtime library, resolver the trace must show
  local cudart="$1" via="$2" trace="$WORK/trace-$(basename "$1")"
  rm -f "$trace"
  local out
  out="$(ARBITER_INTERPOSE_TRACE="$trace" LD_PRELOAD="$SO" \
    LD_LIBRARY_PATH="$DRIVER:$(dirname "$cudart")" "$WORK/cudart_probe" "$(basename "$cudart")")" \
    || fail "$(basename "$cudart"): the probe failed (status $?): $out"
  echo "$out"
  grep -q '^cudaGetDeviceCount rc=100$' <<<"$out" || fail "$(basename "$cudart"): expected cudaErrorNoDevice"
  grep -q '^call cuInit rc=100$' "$trace" || fail "$(basename "$cudart"): cuInit did not go through the interposer"
  grep -q '^lookup via=dlsym name=cuGetProcAddress.* ours=1$' "$trace" \
    || fail "$(basename "$cudart"): the bootstrap dlsym of cuGetProcAddress was not answered by us"
  # Every lookup the driver answered with an entry point we wrap was answered with our wrapper.
  local missed
  missed="$(awk 'NR == FNR { wrapped[$1] = 1; next }
    $1 == "lookup" { d = $6; sub(/^driver=/, "", d); if ((d in wrapped) && $7 != "ours=1") print }' \
    "$WORK/wrapped" "$trace")"
  [ -z "$missed" ] || fail "$(basename "$cudart"): wrapped entry points handed out unwrapped:
$missed"
  local ours total ptsz
  total="$(grep -c "^lookup via=$via " "$trace" || true)"
  ours="$(grep -c ' ours=1$' "$trace" || true)"
  ptsz="$(grep -c 'flags=2 driver=cu[A-Za-z]*_ptsz ours=1$' "$trace" || true)"
  echo "$(basename "$cudart"): $total lookups through $via, $ours answered with our wrappers ($ptsz per-thread _ptsz)"
  [ "$ours" -ge 25 ] || fail "$(basename "$cudart"): only $ours wrapped lookups"
  [ "$ptsz" -ge 5 ] || fail "$(basename "$cudart"): per-thread-stream lookups not wrapped"
  for must in cuInit cuMemAlloc_v2 cuMemFree_v2 cuLaunchKernel cuLaunchKernel_ptsz cuMemAllocAsync_ptsz; do
    grep -q " driver=$must ours=1$" "$trace" || fail "$(basename "$cudart"): $must was not wrapped"
  done
}
check "$CUDART12" gpa2
check "$CUDART11" gpa
echo "real-cuda-check: OK"
