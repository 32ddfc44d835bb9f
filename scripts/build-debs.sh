#!/usr/bin/env bash
# Builds the Debian packages from this tree with dpkg-buildpackage:
#   cxlpool          daemon, cxlpoolctl, systemd units, sysusers/tmpfiles,
#                    /etc/cxlpool/cxlpoold.toml, man pages, bash completion
#   libcxlpool0      the shared library (symbols file: debian/libcxlpool0.symbols)
#   libcxlpool-dev   headers, static library, pkg-config, CMake package, examples
#   python3-cxlpool  the cxlpool Python module (dist-packages)
#   libcxlpool-preload  the LD_PRELOAD shim, in <libdir>/cxlpool
#   *-dbgsym         the split-out debug symbols
#
# usage: scripts/build-debs.sh [--out DIR] [--lintian]
#   --out DIR   where the .deb/.changes/.buildinfo files go (default build/debs)
#   --lintian   run lintian on the result and fail on an error (or on a
#               warning that debian/*.lintian-overrides does not justify)
#
# The tree is first copied (the files git tracks plus untracked ones it does
# not ignore; the whole folder without git) into DIR/.work/cxlpool-<version>,
# a fixed path, so the source tree stays clean and ccache hits across runs.
# The build-dependencies must be installed (scripts/install-deps.sh);
# dpkg-checkbuilddeps names any that is missing.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=$src/build/debs
lintian=0
while (($#)); do
  case $1 in
    --out) out=$2; shift ;;
    --lintian) lintian=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-debs: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
for t in dpkg-buildpackage dpkg-parsechangelog dh; do
  command -v $t >/dev/null || { echo "build-debs: $t missing (scripts/install-deps.sh)" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
version=$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)
project_version=$(sed -nE 's/^project\(cxlpool VERSION ([0-9.]+).*/\1/p' "$src/CMakeLists.txt")
if [[ $version != "$project_version" ]]; then
  echo "build-debs: debian/changelog is at $version but CMakeLists.txt at $project_version;" \
    "add a changelog entry (dch -v $project_version)" >&2
  exit 1
fi

work=$out/.work
tree=$work/cxlpool-$version
rm -rf "$work"
mkdir -p "$tree"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 -r sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh |
    cpio -0 -pdm --quiet "$tree")
  CXLPOOL_GIT_REVISION=$(git -C "$src" describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
else
  (cd "$src" && tar --exclude='./build*' --exclude=./debian/.debhelper -cf - .) | tar -xf - -C "$tree"
  CXLPOOL_GIT_REVISION=${CXLPOOL_GIT_REVISION:-unknown}
fi
export CXLPOOL_GIT_REVISION
# debhelper points HOME at a scratch folder; keep the caller's ccache.
if command -v ccache >/dev/null; then
  CCACHE_DIR=$(ccache -k cache_dir 2>/dev/null || echo "${HOME:-/root}/.cache/ccache")
  export CCACHE_DIR CCACHE_BASEDIR=$tree
fi
jobs=${CXLPOOL_JOBS:-$(nproc)}
export DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}"

echo "build-debs: cxlpool $version ($CXLPOOL_GIT_REVISION) in $tree"
t0=$SECONDS
(cd "$tree" && dpkg-buildpackage -us -uc -b --no-sign)
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo
mv "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$out"/
rm -rf "$work"
echo "build-debs: $((SECONDS - t0)) s; packages in $out:"
(cd "$out" && ls -1 ./*.deb | sed 's#^\./#  #')

if ((lintian)); then
  command -v lintian >/dev/null || { echo "build-debs: lintian missing" >&2; exit 1; }
  changes=$(ls "$out"/*.changes)
  # --fail-on error,warning: a warning fails unless an override justifies it.
  lintian --fail-on error,warning --no-tag-display-limit --info "$changes"
  echo "build-debs: lintian: no errors, no unjustified warnings"
fi
