#!/usr/bin/env bash
# Builds the libarbiter_interpose.so we ship: release, linked against glibc 2.17 (CUDA's own
# baseline) with cargo-zigbuild, so that it loads in every image a GPU node runs (Debian 11,
# Ubuntu 20.04, RHEL 8, Amazon Linux 2 ... all older than the glibc of the build machine),
# then checks the result with scripts/check-glibc-baseline.sh. Prints the path of the .so.
#
# cargo-zigbuild and zig come from PyPI into a private virtual environment
# (target/zig-venv, or $ARBITER_ZIG_VENV); nothing is installed system-wide.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${ARBITER_ZIG_VENV:-$ROOT/target/zig-venv}"
BASELINE=2.17
TARGET_DIR="$ROOT/target/portable"

if ! [ -x "$VENV/bin/cargo-zigbuild" ] || ! [ -x "$VENV/bin/python-zig" ]; then
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q 'cargo-zigbuild==0.24.*' 'ziglang==0.17.*' >&2
fi
(cd "$ROOT" && PATH="$VENV/bin:$PATH" cargo zigbuild -q --release -p arbiter-interpose --lib \
  --target "x86_64-unknown-linux-gnu.$BASELINE" --target-dir "$TARGET_DIR" >&2)
SO="$TARGET_DIR/x86_64-unknown-linux-gnu/release/libarbiter_interpose.so"
bash "$ROOT/scripts/check-glibc-baseline.sh" "$SO" "$BASELINE" >&2
echo "$SO"
