#!/usr/bin/env bash
# Prints the longest functions and files of the product's sources (tests
# excluded), and exits 1 if a function is over 120 lines or a file over 800
# lines, except those listed in scripts/unit-sizes.allow with why one job
# needs the size.
#   scripts/unit-sizes.sh [--top N]
# Needs universal-ctags (it reports where each function ends).
set -euo pipefail
cd "$(dirname "$0")/.."
top=10
[[ ${1:-} == --top ]] && top=$2
dirs=(daemon client_lib topology proto tools common cluster)
max_fn=120
max_file=800
allow=scripts/unit-sizes.allow
ctags=$(command -v ctags-universal || command -v ctags) ||
  { echo "unit-sizes: needs universal-ctags" >&2; exit 2; }
allowed() { [[ -f $allow ]] && grep -qE "^$1( |$)" "$allow"; }

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t sources < <(git ls-files "${dirs[@]}" | grep -E '\.(cc|h|cpp|hpp)$')
else
  mapfile -t sources < <(find "${dirs[@]}" -name '*.cc' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' | sort)
fi
fns=$("$ctags" -x --_xformat='%{end} %n %F %N' --fields=+ne --kinds-c++=f \
  --language-force=C++ "${sources[@]}" 2>/dev/null |
  awk '$1 != "-" { printf "%d %s:%s %s\n", $1 - $2 + 1, $3, $2, $4 }' | sort -rn)
files=$(wc -l "${sources[@]}" | grep -v ' total$' | sort -rn)

echo "longest functions (lines, where, name):"
head -n "$top" <<<"$fns" | sed 's/^/  /'
echo "longest files (lines, path):"
head -n "$top" <<<"$files" | sed 's/^/  /'

bad=0
while read -r n where name; do
  ((n > max_fn)) || break
  allowed "$name" || allowed "${where%%:*}" || { echo "over $max_fn: $name ($where, $n lines)"; bad=1; }
done <<<"$fns"
while read -r n path; do
  ((n > max_file)) || break
  allowed "$path" || { echo "over $max_file: $path ($n lines)"; bad=1; }
done <<<"$files"
exit $bad
