#!/usr/bin/env bash
# run-fuzzer.sh <fuzzer> <seed-corpus> <seconds>: fuzzes from a scratch copy of
# the seed corpus (the committed corpus is never written), prints libFuzzer's
# final stats, and fails on any crash, leak or sanitizer report. A failing
# input is printed (od) so the CI log alone is enough to reproduce it.
set -uo pipefail
fuzzer=$1 seeds=$2 secs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
cp -r "$seeds"/. "$work/corpus/"
cd "$work"
"$fuzzer" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/" corpus >"$work/log" 2>&1
rc=$?
grep -v '^\[libprotobuf' "$work/log" | tail -n 40
if [[ $rc -ne 0 ]]; then
  for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
    [[ -e $a ]] || continue
    echo "failing input $(basename "$a"):"
    od -A x -t x1z "$a" | head -n 64
  done
  echo "FAIL: $(basename "$fuzzer") exited $rc"
fi
exit $rc
