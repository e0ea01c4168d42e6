#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ (cargo fuzz, libFuzzer) and runs each for
# FUZZ_SECONDS (default 15), the trace parsers seeded with the heads of the
# real traces in ../shared/traces. A crash fails the script and leaves its
# input in fuzz/artifacts/<target>/; `cargo fuzz fmt` prints it.
#
# No sanitizer (-s none): the code under test is safe Rust, so what matters is
# coverage guidance and debug assertions, and this builds on the stable
# toolchain. FUZZ_RELEASE=1 builds optimised (slower to build, faster runs:
# for long runs).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-15}
profile=(--dev)
if [ "${FUZZ_RELEASE:-0}" = 1 ]; then profile=(); fi
targets=(decisions traces journal grpc_requests inspect)
if [ $# -gt 0 ]; then targets=("$@"); fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked --version 0.13.2
fi
cargo fuzz build -s none "${profile[@]}"

# Seeds: a selector byte (which parser; see fuzz_targets/traces.rs) and the
# first 4 KiB of a real trace of that format.
seed_trace() {
  local selector=$1 file=$2 out
  [ -f "$file" ] || return 0
  out=fuzz/corpus/traces/seed-$selector-$(basename "$file" | tr -c 'a-z0-9_.\n' _)
  { printf "\\x$(printf %02x "$selector")"; (zcat -f "$file" 2>/dev/null || true) | head -c 4096; } >"$out"
}
mkdir -p fuzz/corpus/traces
traces=../shared/traces
seed_trace 0 $traces/openb/openb_node_list_gpu_node.csv
seed_trace 1 $traces/openb/openb_pod_list_default.csv
seed_trace 2 $traces/openb/reference_alloc.csv
seed_trace 3 $traces/pai2020/pai_machine_spec.csv
seed_trace 4 $traces/pai2020/minibatch_job_1_norm.csv
seed_trace 5 $traces/pai2020/philly_runtime.csv
seed_trace 6 $traces/philly/philly_jobs.csv.gz
seed_trace 7 $traces/genai2026/lora_request_trace.csv.gz
seed_trace 8 $traces/genai2026/qps.csv.gz
seed_trace 9 $traces/genai2026/pod_gpu_duty_cycle_anon.csv.gz

# Committed seeds (e.g. a real journal from `arbiter serve`).
for seeds in fuzz/seeds/*/; do
  target=$(basename "$seeds")
  mkdir -p "fuzz/corpus/$target"
  cp "$seeds"* "fuzz/corpus/$target/"
done

for target in "${targets[@]}"; do
  echo "== fuzz $target (${seconds}s)"
  mkdir -p "fuzz/corpus/$target"
  cargo fuzz run -s none "${profile[@]}" "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -report_slow_units=600 \
    -print_final_stats=1 2>&1 | grep -E '^#[0-9]+ +DONE|^stat::number_of_executed_units|ERROR|panicked|SUMMARY' || true
  # grep's status is not the fuzzer's: cargo fuzz's is.
  status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    echo "fuzz target $target failed (status $status); input in fuzz/artifacts/$target/" >&2
    exit "$status"
  fi
done
