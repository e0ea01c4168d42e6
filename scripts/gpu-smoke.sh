#!/usr/bin/env bash
# GPU smoke test for libarbiter_interpose.so against real CUDA + PyTorch.
#
# Runs the same checks as interpose/tests/e2e.rs, on a real GPU:
#   1. quota: a torch allocation beyond the quota raises torch.cuda.OutOfMemoryError, and
#      torch.cuda.mem_get_info() reports the quota view;
#   2. pacing: two processes paced to a 30/70 compute share split their measured throughput
#      about 30/70 (the node's job is done here by this script: interval = kernel time / share);
#   3. graceful exit: SIGTERM during a training loop synchronizes, releases the context and the
#      process dies by SIGTERM (status 143), with no process left on the GPU.
#
# Usage: scripts/gpu-smoke.sh            (needs: nvidia driver, python3 with torch+CUDA, cargo)
# Env:   PYTHON (default python3), QUOTA_GIB (default 2), SHARE_SECONDS (default 20)
# Exit status: 0 if every check passed. Record the output in docs/gpu-validation.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
QUOTA_GIB="${QUOTA_GIB:-2}"
SHARE_SECONDS="${SHARE_SECONDS:-20}"
WORK="$(mktemp -d /tmp/arbiter-gpu-smoke.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
FAILS=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

echo "== environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

echo "== building libarbiter_interpose.so (release)"
(cd "$ROOT" && CARGO_TARGET_DIR="$ROOT/target-interpose" cargo build --release -p arbiter-interpose)
SO="$ROOT/target-interpose/release/libarbiter_interpose.so"
test -f "$SO"

# Control-block writer: the layout of interpose/src/control.rs (version 2, BLOCK_SIZE bytes as
# its `layout_is_stable` test states), little-endian u64s.
cat > "$WORK/block.py" <<'PY'
import mmap, os, struct, sys
MAGIC = int.from_bytes(b"ARBITER1", "little")
VERSION, SIZE = 2, 256 + 64 * 16 + 192 * 64
OFF = {"devices": 88,"quota": 16, "interval": 24, "burst": 32, "epoch": 40, "flags": 48, "period": 56,
       "used": 128, "peak": 136, "launches": 192 + 32, "allocs": 192, "denials": 192 + 16,
       "delay": 192 + 48}
def create(path, quota, interval):
    with open(path, "wb") as f:
        f.write(bytes(SIZE))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), SIZE)
        struct.pack_into("<Q", m, 8, VERSION)
        struct.pack_into("<Q", m, OFF["devices"], 1)
        struct.pack_into("<Q", m, OFF["quota"], quota)
        struct.pack_into("<Q", m, OFF["interval"], interval)
        struct.pack_into("<Q", m, OFF["period"], 100_000_000)
        struct.pack_into("<Q", m, 0, MAGIC)
        m.close()
def get(path, key):
    with open(path, "rb") as f:
        return struct.unpack_from("<Q", f.read(SIZE), OFF[key])[0]
if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "create":
        create(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "get":
        print(get(sys.argv[2], sys.argv[3]))
PY
block() { "$PYTHON" "$WORK/block.py" "$@"; }
run_preloaded() { # block-path, then command
  local b="$1"; shift
  ARBITER_CONTROL_BLOCK="$b" LD_PRELOAD="$SO" "$@"
}

echo "== 1. memory quota (${QUOTA_GIB} GiB)"
QUOTA=$((QUOTA_GIB * 1024 * 1024 * 1024))
block create "$WORK/q.blk" "$QUOTA" 0
cat > "$WORK/quota.py" <<'PY'
import sys, torch
quota = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
print(f"mem_get_info free={free} total={total}")
assert total <= quota, "total must be the quota view"
half = torch.empty(quota // 2, dtype=torch.uint8, device="cuda")
try:
    big = torch.empty(quota, dtype=torch.uint8, device="cuda")
    print("no OOM")
    sys.exit(1)
except torch.cuda.OutOfMemoryError as e:
    print("OOM raised as expected:", str(e).splitlines()[0])
del half
torch.cuda.empty_cache()
ok = torch.empty(quota // 2, dtype=torch.uint8, device="cuda")
print("allocation within quota after free: ok")
PY
if run_preloaded "$WORK/q.blk" "$PYTHON" "$WORK/quota.py" "$QUOTA"; then
  pass "quota: OOM beyond ${QUOTA_GIB} GiB, mem_get_info shows quota (peak used $(block get "$WORK/q.blk" peak) B)"
else
  fail "quota"
fi

echo "== 2. pacing 30/70"
cat > "$WORK/bench.py" <<'PY'
import sys, time, torch
secs = float(sys.argv[1])
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
for _ in range(10): a @ b
torch.cuda.synchronize()
n, t0 = 0, time.time()
while time.time() - t0 < secs:
    c = a @ b; n += 1
    if n % 10 == 0: torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"its_per_s={n / (time.time() - t0):.2f}")
PY
block create "$WORK/solo.blk" 18446744073709551615 0
SOLO=$(run_preloaded "$WORK/solo.blk" "$PYTHON" "$WORK/bench.py" 10 | sed -n 's/its_per_s=//p')
echo "solo throughput: $SOLO it/s"
# Each matmul is about one kernel launch (cuBLAS may add small helper kernels).
LAUNCHES=$(block get "$WORK/solo.blk" launches)
echo "solo launches counted: $LAUNCHES"
MEAN_NS=$("$PYTHON" -c "print(int(1e9 / $SOLO))")
I30=$("$PYTHON" -c "print(int($MEAN_NS / 0.3))"); I70=$("$PYTHON" -c "print(int($MEAN_NS / 0.7))")
block create "$WORK/p30.blk" 18446744073709551615 "$I30"
block create "$WORK/p70.blk" 18446744073709551615 "$I70"
run_preloaded "$WORK/p30.blk" "$PYTHON" "$WORK/bench.py" "$SHARE_SECONDS" > "$WORK/p30.out" &
P1=$!
run_preloaded "$WORK/p70.blk" "$PYTHON" "$WORK/bench.py" "$SHARE_SECONDS" > "$WORK/p70.out" &
P2=$!
wait $P1 $P2
T30=$(sed -n 's/its_per_s=//p' "$WORK/p30.out"); T70=$(sed -n 's/its_per_s=//p' "$WORK/p70.out")
SPLIT=$("$PYTHON" -c "t=$T30+$T70; print(f'{100*$T30/t:.1f}/{100*$T70/t:.1f}')")
echo "paced throughput: 30% tenant $T30 it/s, 70% tenant $T70 it/s, split $SPLIT"
if "$PYTHON" -c "import sys; t=$T30+$T70; s=$T30/t; sys.exit(0 if 0.25 <= s <= 0.35 else 1)"; then
  pass "pacing split $SPLIT (target 30/70)"
else
  fail "pacing split $SPLIT (target 30/70)"
fi

echo "== 3. SIGTERM during training"
cat > "$WORK/train.py" <<'PY'
import torch
m = torch.nn.Linear(4096, 4096).cuda(); opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x = torch.randn(256, 4096, device="cuda")
i = 0
while True:
    loss = m(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step(); i += 1
    if i == 20:
        torch.cuda.synchronize(); print("ready", flush=True)
PY
block create "$WORK/t.blk" 18446744073709551615 0
ARBITER_INTERPOSE_LOG=1 run_preloaded "$WORK/t.blk" "$PYTHON" "$WORK/train.py" > "$WORK/train.out" 2> "$WORK/train.err" &
TP=$!
for _ in $(seq 1 120); do grep -q ready "$WORK/train.out" 2>/dev/null && break; sleep 0.5; done
kill -TERM "$TP"
set +e; wait "$TP"; STATUS=$?; set -e
cat "$WORK/train.err" | grep arbiter-interpose || true
sleep 1
LEFT=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -cw "$TP" || true)
if [ "$STATUS" -eq 143 ] && grep -q "contexts released" "$WORK/train.err" && [ "$LEFT" -eq 0 ]; then
  pass "SIGTERM: status $STATUS, contexts released, no process left on the GPU"
else
  fail "SIGTERM: status $STATUS, left on GPU: $LEFT"
fi

echo "== summary: $FAILS failure(s)"
exit "$FAILS"
