#!/usr/bin/env bash
# Fails when a shared object needs a glibc symbol version newer than the baseline.
#
#   scripts/check-glibc-baseline.sh FILE.so [BASELINE]      (BASELINE defaults to 2.17)
#
# The interposer is preloaded into every process of a workload, whatever image it runs: one
# symbol version newer than the image's glibc and the process dies before main ("version
# `GLIBC_2.34' not found"). 2.17 is CUDA's own baseline (RHEL/CentOS 7). Reads the dynamic
# symbol table (`objdump -T`) and the version-need section (`objdump -p`), so a version that
# is required but never named by a symbol is caught too.
set -euo pipefail
so="${1:?usage: check-glibc-baseline.sh FILE.so [BASELINE]}"
baseline="${2:-2.17}"
test -f "$so" || { echo "check-glibc-baseline: $so: no such file" >&2; exit 2; }
command -v objdump >/dev/null || { echo "check-glibc-baseline: objdump (binutils) is missing" >&2; exit 2; }

newer() { # is $1 > $2 as a version?
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -n 1)" = "$1" ]
}

tables="$( { objdump -T "$so"; objdump -p "$so"; } )"
versions=$(grep -o 'GLIBC_[0-9][0-9.]*' <<<"$tables" | sort -u -V || true)
[ -n "$versions" ] || { echo "check-glibc-baseline: $so names no GLIBC version at all" >&2; exit 2; }
bad=0
if grep -q 'GLIBC_PRIVATE' <<<"$tables"; then
  bad=1
  echo "check-glibc-baseline: $so needs GLIBC_PRIVATE symbols (they change between releases):" >&2
  objdump -T "$so" | grep -F "GLIBC_PRIVATE" | awk '{print "    " $NF}' >&2 || true
fi
for v in $versions; do
  n="${v#GLIBC_}"
  if newer "$n" "$baseline"; then
    bad=1
    echo "check-glibc-baseline: $so needs $v (baseline $baseline):" >&2
    objdump -T "$so" | grep -F "($v)" | awk '{print "    " $NF}' >&2 || true
  fi
done
if [ "$bad" -ne 0 ]; then
  exit 1
fi
echo "check-glibc-baseline: $so needs nothing newer than GLIBC_$baseline ($(echo $versions | wc -w) versions)"
