#!/usr/bin/env bash
# Package test on the .deb files scripts/build-debs.sh made (package_build):
#   1. what each package holds, and what it must not (examples in /usr/bin,
#      headers, the Python module or the preload shim in the daemon's
#      package, debug info in a binary);
#   2. the control data: conffiles, shlibs, the symbols file, the ldconfig
#      trigger, the -dbgsym packages with their .debug files;
#   3. an install of every package into a scratch
#      dpkg root (maintainer scripts chrootless with $DPKG_ROOT: the host is
#      untouched), where sysusers creates cxlpool and cxlpool-admin;
#   4. the example clients built against the installed files through
#      pkg-config, pkg-config --static (a fully static binary: the .pc lists
#      every private library, libstdc++ included), find_package(cxlpool) for
#      the shared and the static library, and find_package with Protobuf
#      unavailable (the shared library needs nothing else; the static
#      component is then refused), all run against the installed daemon;
#   5. the installed Python module leasing from that daemon, and the installed
#      preload shim (an unversioned SONAME, only the CUDA entry points exported).
# usage: package-test.sh <source-dir> <packages-dir>
set -euo pipefail
src=$(cd "$1" && pwd)
pkgs=$(cd "$2" && pwd)
work=$(mktemp -d /tmp/cxlpool-pkg-XXXXXX)
daemon_pid=
cleanup() {
  [[ -n $daemon_pid ]] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  [[ -z ${KEEP:-} ]] && rm -rf "$work"
  return 0
}
trap cleanup EXIT
for t in dpkg dpkg-deb pkg-config cc c++ cmake file; do
  command -v $t >/dev/null || { echo "SKIP: $t missing"; exit 77; }
done
export CCACHE_BASEDIR=$src
step() { echo "== $*"; }
fail() { echo "FAIL: $*"; exit 1; }
one() {  # the single file matching a glob
  local f
  f=$(ls $1 2>/dev/null | head -n1)
  [[ -n $f ]] || fail "no $1 (run package_build)"
  echo "$f"
}
daemon_deb=$(one "$pkgs/cxlpool_*.deb")
lib_deb=$(one "$pkgs/libcxlpool0_*.deb")
dev_deb=$(one "$pkgs/libcxlpool-dev_*.deb")
daemon_dbg=$(one "$pkgs/cxlpool-dbgsym_*.deb")
lib_dbg=$(one "$pkgs/libcxlpool0-dbgsym_*.deb")
py_dbg=$(one "$pkgs/python3-cxlpool-dbgsym_*.deb")
preload_dbg=$(one "$pkgs/libcxlpool-preload-dbgsym_*.deb")
py_deb=$(one "$pkgs/python3-cxlpool_*.deb")
preload_deb=$(one "$pkgs/libcxlpool-preload_*.deb")
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=usr/lib/$arch

step "contents"
contents() { dpkg-deb -c "$1" | awk '{ print $6 }' | sed 's#^\./##'; }
need() {  # deb path...
  local deb=$1 c
  shift
  c=$(contents "$deb")
  for f in "$@"; do grep -qxF "$f" <<<"$c" || fail "$f not in $(basename "$deb")"; done
}
need "$daemon_deb" usr/sbin/cxlpoold usr/bin/cxlpoolctl \
  lib/systemd/system/cxlpoold.service lib/systemd/system/cxlpoold.socket \
  lib/systemd/system/cxlpoold-metrics.socket usr/lib/sysusers.d/cxlpool.conf \
  usr/lib/tmpfiles.d/cxlpool.conf etc/cxlpool/cxlpoold.toml usr/share/man/man8/cxlpoold.8.gz \
  usr/share/man/man8/cxlpoolctl.8.gz usr/share/bash-completion/completions/cxlpoolctl \
  usr/share/cxlpool/cxlpoold-sampling.conf \
  usr/share/doc/cxlpool/copyright usr/share/doc/cxlpool/changelog.gz \
  usr/share/doc/cxlpool/service.md usr/share/doc/cxlpool/daemon.md
need "$lib_deb" "$libdir/libcxlpool.so.0" "$libdir/libcxlpool.so.0.1.0"
need "$dev_deb" usr/include/cxlpool/cxlpool.h usr/include/cxlpool/client.hpp \
  "$libdir/libcxlpool.so" "$libdir/libcxlpool.a" "$libdir/pkgconfig/cxlpool.pc" \
  "$libdir/cmake/cxlpool/cxlpoolConfig.cmake" "$libdir/cmake/cxlpool/cxlpoolTargets.cmake" \
  "$libdir/cmake/cxlpool/cxlpoolStaticTargets.cmake" usr/share/man/man3/libcxlpool.3.gz \
  usr/share/doc/libcxlpool-dev/examples/cxlpool-example.c \
  usr/share/doc/libcxlpool-dev/examples/cxlpool-example-cpp.cc
pydir=usr/lib/python3/dist-packages/cxlpool
need "$py_deb" "$pydir/__init__.py" "$pydir/errors.py" "$pydir/torch.py" "$pydir/py.typed" \
  "$pydir/_cxlpool.pyi"
contents "$py_deb" | grep -qE "^$pydir/_cxlpool(\.cpython-[^/]*)?\.so$" || fail "no _cxlpool module in python3-cxlpool"
contents "$py_deb" | grep -qE '^usr/lib/[^p]|^usr/(s?bin|include)/' && fail "python3-cxlpool ships more than the module"
need "$preload_deb" "$libdir/cxlpool/libcxlpool_preload.so"
contents "$preload_deb" | grep -E '\.so' | grep -vxF "$libdir/cxlpool/libcxlpool_preload.so" &&
  fail "libcxlpool-preload ships another library"
for deb in "$daemon_deb" "$lib_deb" "$dev_deb"; do
  contents "$deb" | grep -qE 'dist-packages|\.py$|libcxlpool_preload' &&
    fail "$(basename "$deb") ships the Python module or the preload shim"
done
for deb in "$daemon_deb" "$lib_deb" "$dev_deb" "$py_deb" "$preload_deb"; do
  if contents "$deb" | grep -E '^usr/bin/cxlpool-example|^usr/bin/cxlpool-bench|\.debug$'; then
    fail "$(basename "$deb") ships an example, a bench or debug info"
  fi
done
contents "$daemon_deb" | grep -qE '^usr/include|\.a$|\.so(\.|$)' && fail "cxlpool ships library files"
contents "$lib_deb" | grep -qE '^usr/include|\.a$|/libcxlpool\.so$' && fail "libcxlpool0 ships -dev files"
for dbg in "$daemon_dbg" "$lib_dbg" "$py_dbg" "$preload_dbg"; do
  contents "$dbg" | grep -qE '^usr/lib/debug/\.build-id/[0-9a-f]{2}/[0-9a-f]+\.debug$' ||
    fail "$(basename "$dbg") has no .build-id/*.debug"
done
echo "ok: the files are in their packages; examples only as sources"

step "control data"
dpkg-deb -I "$daemon_deb" conffiles | grep -qx /etc/cxlpool/cxlpoold.toml || fail "conffiles"
dpkg-deb -I "$lib_deb" shlibs | grep -qE '^libcxlpool 0 libcxlpool0( |$)' || fail "shlibs"
dpkg-deb -I "$lib_deb" symbols | grep -q '^ cxlpool_connect@CXLPOOL_0.1 ' || fail "symbols file"
dpkg-deb -I "$lib_deb" triggers | grep -qx 'activate-noawait ldconfig' || fail "ldconfig trigger"
deps=$(dpkg-deb -f "$daemon_deb" Depends)
[[ $deps == *libnuma1* && $deps == *libdaxctl1* && $deps == *systemd* ]] || fail "cxlpool Depends: $deps"
deps=$(dpkg-deb -f "$py_deb" Depends)
[[ $deps == *libcxlpool0* && $deps == *python3* ]] || fail "python3-cxlpool Depends: $deps"
echo "ok: conffiles, shlibs, symbols, ldconfig trigger, dependencies"

step "stripped binaries, configuration"
mkdir -p "$work/x"
dpkg-deb -x "$daemon_deb" "$work/x"
dpkg-deb -x "$lib_deb" "$work/x"
dpkg-deb -x "$py_deb" "$work/x"
dpkg-deb -x "$preload_deb" "$work/x"
pymod=$(cd "$work/x" && ls usr/lib/python3/dist-packages/cxlpool/_cxlpool*.so)
for b in usr/sbin/cxlpoold usr/bin/cxlpoolctl "$libdir/libcxlpool.so.0.1.0" "$pymod" \
  "$libdir/cxlpool/libcxlpool_preload.so"; do
  file -L "$work/x/$b" | grep -q ', stripped' || fail "$b is not stripped: $(file -L "$work/x/$b")"
done
size=$(stat -c %s "$work/x/usr/sbin/cxlpoold")
((size < 16 * 1024 * 1024)) || fail "cxlpoold is $size bytes"
echo "ok: stripped (cxlpoold $((size / 1024)) KiB)"
# The shipped configuration is the embedded default plus the admin group.
diff <("$work/x/usr/sbin/cxlpoold" --print-default-config 2>/dev/null ||
         LD_LIBRARY_PATH=$work/x/$libdir "$work/x/usr/sbin/cxlpoold" --print-default-config) \
  "$work/x/etc/cxlpool/cxlpoold.toml" >"$work/toml.diff" || true
[[ $(grep -c '^[<>]' "$work/toml.diff") == 2 ]] &&
  grep -qx '> admin_group = "cxlpool-admin"' "$work/toml.diff" ||
  fail "the shipped config differs from the default by more than admin_group: $(cat "$work/toml.diff")"
grep -q "ExecStart=/usr/sbin/cxlpoold --config /etc/cxlpool/cxlpoold.toml" \
  "$work/x/lib/systemd/system/cxlpoold.service" || fail "unit ExecStart"
echo "ok: /etc/cxlpool/cxlpoold.toml = default + admin_group = \"cxlpool-admin\""

step "install into a scratch root"
root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc"
touch "$root/var/lib/dpkg/status"
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
  --log=/dev/null -i "$lib_deb" "$dev_deb" "$daemon_deb" "$preload_deb" \
  >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i into the scratch root"; }
# python3-cxlpool is only unpacked: its postinst (py3compile) byte-compiles
# the host's /usr/lib/python3, it knows nothing of a scratch root. The
# systemd VM test (tests/vm/guest/systemd-checks.sh) installs and configures
# it for real.
dpkg --root="$root" --force-depends --force-not-root --force-script-chrootless \
  --log=/dev/null --unpack "$py_deb" >>"$work/dpkg.log" 2>&1 ||
  { cat "$work/dpkg.log"; fail "dpkg --unpack python3-cxlpool into the scratch root"; }
for p in cxlpool libcxlpool0 libcxlpool-dev libcxlpool-preload; do
  dpkg --root="$root" -s "$p" | grep -q "Status: install ok installed" || fail "$p not installed"
done
dpkg --root="$root" -s python3-cxlpool | grep -q "Status: install ok unpacked" ||
  fail "python3-cxlpool not unpacked"
if command -v systemd-sysusers >/dev/null; then
  grep -q '^cxlpool:' "$root/etc/passwd" || fail "postinst did not create user cxlpool in the root"
  grep -q '^cxlpool-admin:' "$root/etc/group" || fail "no cxlpool-admin group in the root"
fi
echo "ok: installed; sysusers made cxlpool and cxlpool-admin in the root"

export LD_LIBRARY_PATH="$root/$libdir"
ex=$root/usr/share/doc/libcxlpool-dev/examples
step "examples via pkg-config (shared, and fully static with --static)"
export PKG_CONFIG_PATH="$root/$libdir/pkgconfig"
mkdir -p "$work/pc"
# shellcheck disable=SC2046  # pkg-config's flags are meant to be split
cc -std=c11 -Wall -Werror "$ex/cxlpool-example.c" $(pkg-config --cflags --libs cxlpool) \
  -o "$work/pc/example-c"
# shellcheck disable=SC2046
c++ -std=c++20 -Wall -Werror "$ex/cxlpool-example-cpp.cc" $(pkg-config --cflags --libs cxlpool) \
  -o "$work/pc/example-cpp"
grep -q "$root" <(pkg-config --cflags cxlpool) || fail "pkg-config not relocated into the root"
# A C program, linked with the C driver: everything C++ must come from the .pc.
# shellcheck disable=SC2046
cc -std=c11 -static "$ex/cxlpool-example.c" $(pkg-config --static --cflags --libs cxlpool) \
  -o "$work/pc/example-static" 2>"$work/static.log" ||
  { cat "$work/static.log"; fail "static link through pkg-config --static"; }
file "$work/pc/example-static" | grep -q 'statically linked' || fail "not static: $(file "$work/pc/example-static")"
echo "ok: shared C and C++, and a static C binary from pkg-config --static"

step "examples via find_package(cxlpool)"
consumer() {  # dir extra-cmake-args...
  local d=$1
  shift
  mkdir -p "$d"
  cp "$work/fp.cmake" "$d/CMakeLists.txt"
  cmake -S "$d" -B "$d/build" -DCMAKE_PREFIX_PATH="$root/usr" "$@" >"$d/cmake.log" 2>&1
}
cat >"$work/fp.cmake" <<CM
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
option(WANT_STATIC "" ON)
if(WANT_STATIC)
  find_package(cxlpool 0.1 REQUIRED COMPONENTS static)
else()
  find_package(cxlpool 0.1 REQUIRED)
endif()
add_executable(example-c $ex/cxlpool-example.c)
target_link_libraries(example-c PRIVATE cxlpool::cxlpool)
if(WANT_STATIC)
  add_executable(example-static $ex/cxlpool-example.c)
  target_link_libraries(example-static PRIVATE cxlpool::cxlpool_static)
endif()
CM
consumer "$work/fp" || { cat "$work/fp/cmake.log"; fail "find_package(cxlpool COMPONENTS static)"; }
cmake --build "$work/fp/build" >/dev/null
ldd "$work/fp/build/example-static" | grep -q libcxlpool && fail "example-static links libcxlpool.so"
consumer "$work/fp-noproto" -DWANT_STATIC=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON ||
  { cat "$work/fp-noproto/cmake.log"; fail "find_package(cxlpool) needs Protobuf for the shared library"; }
cmake --build "$work/fp-noproto/build" >/dev/null
if consumer "$work/fp-noproto-static" -DWANT_STATIC=ON -DCMAKE_DISABLE_FIND_PACKAGE_Protobuf=ON; then
  fail "COMPONENTS static was found without Protobuf"
fi
echo "ok: shared and static targets; the shared one without Protobuf; static refused without it"

step "run the examples against the installed daemon"
sock=$work/cxlpool.sock
sed 's/^admin_group = "cxlpool-admin"$/admin_group = ""/' "$root/etc/cxlpool/cxlpoold.toml" \
  >"$work/cxlpoold.toml"  # this host has no cxlpool-admin group
"$root/usr/sbin/cxlpoold" --foreground --socket "$sock" --config "$work/cxlpoold.toml" \
  --state-dir "$work/state" >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do [[ -S $sock ]] && break; sleep 0.05; done
[[ -S $sock ]] || { cat "$work/daemon.log"; fail "daemon did not start"; }
for exe in "$work/pc/example-c" "$work/pc/example-cpp" "$work/pc/example-static" \
  "$work/fp/build/example-c" "$work/fp/build/example-static" "$work/fp-noproto/build/example-c"; do
  CXLPOOL_SOCKET=$sock "$exe" --size 4M >"$work/ex.log" 2>&1 ||
    CXLPOOL_SOCKET=$sock "$exe" "$sock" 4M >"$work/ex.log" 2>&1 ||
    { cat "$work/ex.log"; fail "$exe"; }
done
"$root/usr/bin/cxlpoolctl" --socket "$sock" pools >/dev/null
"$root/usr/bin/cxlpoolctl" --version | grep -q "^cxlpoolctl 0.1.0 (git " || fail "installed --version"
echo "ok: the examples lease from the installed daemon"

step "the installed Python module and preload shim"
if command -v python3 >/dev/null; then
  CXLPOOL_SOCKET=$sock python3 -I -c '
import sys
sys.path.insert(0, sys.argv[1])
import cxlpool
assert cxlpool.__file__.startswith(sys.argv[1]), cxlpool.__file__
with cxlpool.Client() as c:
    with c.allocate(1 << 20, label="package-test") as lease:
        m = memoryview(lease)
        m[0] = 0x5A
        assert m[0] == 0x5A and lease.size >= 1 << 20
        del m
print("python:", cxlpool.__version__, cxlpool.__file__)' "$root/usr/lib/python3/dist-packages" ||
    fail "the installed Python module"
else
  echo "(no python3 here: the module is not imported)"
fi
shim=$root/$libdir/cxlpool/libcxlpool_preload.so
soname=$(readelf -d "$shim" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ -z $soname || $soname == libcxlpool_preload.so ]] || fail "the preload shim's SONAME is $soname"
readelf -W --dyn-syms "$shim" | awk '$5 == "GLOBAL" && $7 != "UND" { print $8 }' | grep -qx cudaHostAlloc ||
  fail "the preload shim does not export cudaHostAlloc"
LD_PRELOAD=$shim /bin/true || fail "LD_PRELOAD of the installed shim"
names=()
for deb in "$daemon_deb" "$lib_deb" "$dev_deb" "$py_deb" "$preload_deb"; do names+=("$(basename "$deb")"); done
echo "package test: ok (${names[*]})"
