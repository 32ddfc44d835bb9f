#!/usr/bin/env bash
# Package test: builds the .deb (CPack, prefix /usr), checks its contents,
# installs it into a scratch root with dpkg --root (maintainer scripts run
# chrootless with $DPKG_ROOT, so the host is untouched), then builds the
# example client against the installed headers twice — through pkg-config and
# through find_package(cxlpool) — and runs both against the installed daemon.
# Usage: package-test.sh <source-dir> [work-dir]
set -euo pipefail
src=$(cd "$1" && pwd)
work=${2:-$(mktemp -d /tmp/cxlpool-pkg-XXXXXX)}
mkdir -p "$work"
daemon_pid=
cleanup() {
  [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  [[ -z ${KEEP:-} ]] && rm -rf "$work"
  return 0
}
trap cleanup EXIT
for t in cmake cpack dpkg dpkg-deb pkg-config cc c++; do
  command -v $t >/dev/null || { echo "SKIP: $t missing"; exit 77; }
done
export CCACHE_BASEDIR=$src
step() { echo "== $*"; }

step "configure + build with prefix /usr (no tests)"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_INSTALL_PREFIX=/usr -DCXLPOOL_BUILD_TESTS=OFF -DCXLPOOL_BUILD_BENCH=OFF >/dev/null
cmake --build "$work/build" -j "${CXLPOOL_JOBS:-2}" >/dev/null
step "cpack"
(cd "$work/build" && cpack -G DEB >/dev/null)
deb=$(ls "$work"/build/cxlpool_*.deb)
echo "$deb"

step "contents"
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
libdir=$(cd "$work/build" && grep -m1 '^CMAKE_INSTALL_LIBDIR:' CMakeCache.txt | cut -d= -f2)
for f in ./usr/sbin/cxlpoold ./usr/bin/cxlpoolctl ./usr/include/cxlpool/cxlpool.h \
  ./usr/include/cxlpool/client.hpp "./usr/$libdir/libcxlpool.a" \
  "./usr/$libdir/pkgconfig/cxlpool.pc" "./usr/$libdir/cmake/cxlpool/cxlpoolConfig.cmake" \
  ./usr/lib/systemd/system/cxlpoold.service ./usr/lib/systemd/system/cxlpoold.socket \
  ./usr/lib/sysusers.d/cxlpool.conf ./usr/lib/tmpfiles.d/cxlpool.conf \
  ./etc/cxlpool/cxlpoold.toml ./usr/share/man/man8/cxlpoold.8 ./usr/share/man/man8/cxlpoolctl.8 \
  ./usr/share/man/man3/libcxlpool.3 ./usr/share/bash-completion/completions/cxlpoolctl; do
  grep -qxF "$f" <<<"$contents" || { echo "FAIL: $f not in the package"; exit 1; }
done
grep -q "^./usr/$libdir/libcxlpool.so.0" <<<"$contents" || { echo "FAIL: no libcxlpool.so.0"; exit 1; }
dpkg-deb -I "$deb" conffiles | grep -qx /etc/cxlpool/cxlpoold.toml || { echo "FAIL: conffiles"; exit 1; }
grep -q "ExecStart=/usr/sbin/cxlpoold" <(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/lib/systemd/system/cxlpoold.service) \
  || { echo "FAIL: unit ExecStart"; exit 1; }

step "install into a scratch root"
root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
  --log=/dev/null -i "$deb" >/dev/null
dpkg --root="$root" -s cxlpool | grep -q "Status: install ok installed"
[[ -x $root/usr/sbin/cxlpoold ]] || { echo "FAIL: daemon not installed"; exit 1; }
if command -v systemd-sysusers >/dev/null; then
  grep -q '^cxlpool:' "$root/etc/passwd" || { echo "FAIL: postinst did not create user cxlpool in the root"; exit 1; }
  grep -q '^cxlpool-admin:' "$root/etc/group" || { echo "FAIL: no cxlpool-admin group"; exit 1; }
fi

export LD_LIBRARY_PATH="$root/usr/$libdir"
step "example via pkg-config"
export PKG_CONFIG_PATH="$root/usr/$libdir/pkgconfig"
mkdir -p "$work/pc"
cc -std=c11 -Wall -Werror "$root/usr/share/doc/cxlpool/examples/cxlpool-example.c" \
  $(pkg-config --cflags --libs cxlpool) -o "$work/pc/example-c"
c++ -std=c++20 -Wall -Werror "$root/usr/share/doc/cxlpool/examples/cxlpool-example-cpp.cc" \
  $(pkg-config --cflags --libs cxlpool) -o "$work/pc/example-cpp"
grep -q "$root" <(pkg-config --cflags cxlpool) || { echo "FAIL: pkg-config not relocated into the root"; exit 1; }

step "example via find_package(cxlpool)"
mkdir -p "$work/fp"
cat >"$work/fp/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
find_package(cxlpool 0.1 REQUIRED)
add_executable(example-c $root/usr/share/doc/cxlpool/examples/cxlpool-example.c)
target_link_libraries(example-c PRIVATE cxlpool::cxlpool)
add_executable(example-static $root/usr/share/doc/cxlpool/examples/cxlpool-example.c)
target_link_libraries(example-static PRIVATE cxlpool::cxlpool_static)
CM
cmake -S "$work/fp" -B "$work/fp/build" -DCMAKE_PREFIX_PATH="$root/usr" >/dev/null
cmake --build "$work/fp/build" >/dev/null

step "run the examples against the installed daemon"
sock=$work/cxlpool.sock
"$root/usr/sbin/cxlpoold" --foreground --socket "$sock" --config "$root/etc/cxlpool/cxlpoold.toml" \
  --state-dir "$work/state" >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { echo "FAIL: daemon did not start"; cat "$work/daemon.log"; exit 1; }
for ex in "$work/pc/example-c" "$work/pc/example-cpp" "$work/fp/build/example-c" "$work/fp/build/example-static"; do
  CXLPOOL_SOCKET=$sock "$ex" >"$work/ex.log" 2>&1 || { echo "FAIL: $ex"; cat "$work/ex.log"; exit 1; }
done
"$root/usr/bin/cxlpoolctl" pools --socket "$sock" >/dev/null
echo "package test: ok ($(basename "$deb"))"
