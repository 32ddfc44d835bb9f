#!/usr/bin/env bash
# lintian on the packages scripts/build-debs.sh made: exit 1 on any error, or
# on a warning that no override in debian/*.lintian-overrides justifies
# (each override carries its reason as a comment). Prints every tag seen.
# usage: lintian-check.sh <packages-dir>
set -euo pipefail
dir=$1
command -v lintian >/dev/null || { echo "SKIP: lintian missing (scripts/install-deps.sh)"; exit 77; }
changes=$(ls "$dir"/cxlpool_*.changes 2>/dev/null | head -n1)
[[ -n $changes ]] || { echo "FAIL: no .changes in $dir (package_build)"; exit 1; }
rc=0
lintian --fail-on error,warning --no-tag-display-limit --display-info --show-overrides \
  "$changes" >"$dir/lintian.txt" 2>&1 || rc=$?
cat "$dir/lintian.txt"
errors=$(grep -c '^E: ' "$dir/lintian.txt" || true)
warnings=$(grep -c '^W: ' "$dir/lintian.txt" || true)
overridden=$(grep -c '^O: ' "$dir/lintian.txt" || true)
echo "lintian: $errors errors, $warnings warnings, $overridden overridden (exit $rc)"
exit $((rc != 0))
