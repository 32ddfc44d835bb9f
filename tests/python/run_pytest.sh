#!/usr/bin/env bash
# ctest's runner for one pytest file: run_pytest.sh PYTHON FILE [MODULE...]
# Exits 77 (skipped) when the interpreter lacks pytest or one of the
# MODULEs, or the built package cannot be imported; otherwise pytest's own
# status (5, "no tests collected", is a failure here).
set -u
py=$1 file=$2
shift 2
for m in pytest cxlpool "$@"; do
  if ! "$py" -c "import $m" 2>/dev/null; then
    echo "run_pytest: $py cannot import $m: skipped ($("$py" -c "import $m" 2>&1 | tail -1))" >&2
    exit 77
  fi
done
"$py" -m pytest -q -p no:cacheprovider "$file"
rc=$?
[[ $rc == 5 ]] && { echo "run_pytest: no tests collected in $file" >&2; exit 1; }
exit $rc
