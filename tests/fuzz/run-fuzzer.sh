#!/usr/bin/env bash
# run-fuzzer.sh <fuzzer> <seed-corpus> <seconds>: fuzzes from a scratch copy of
# the seed corpus (the committed corpus is never written), prints libFuzzer's
# final stats, and fails on any crash, leak or sanitizer report.
set -euo pipefail
fuzzer=$1 seeds=$2 secs=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$seeds"/. "$work/corpus/" 2>/dev/null || mkdir -p "$work/corpus"
cd "$work"
"$fuzzer" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/" corpus 2>&1 | tail -n 25
