#!/usr/bin/env bash
# Installs the whole project into a temp prefix (nothing may land outside it),
# then libcxlpool (component "client") alone, and builds and runs the examples
# as outside consumers would:
# find_package(cxlpool) with cxlpool::cxlpool and cxlpool::cxlpool_static,
# and pkg-config. The programs must fail cleanly (exit 1, NOT_FOUND message)
# against a socket that does not exist.
set -euo pipefail
build=$1
src=$2
command -v pkg-config >/dev/null || { echo "pkg-config missing: skipping"; exit 77; }
tmp=$(mktemp -d /tmp/cxlpool-packaging-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The whole install stays inside its prefix: the configuration under P/etc,
# the units under P/lib/systemd/system, nothing in /etc or /usr/local.
cmake --install "$build" --prefix "$tmp/full" >/dev/null
outside=$(grep -v "^$tmp/full/" "$build/install_manifest.txt" || true)
[[ -z $outside ]] || { echo "cmake --install --prefix wrote outside the prefix: $outside"; exit 1; }
for f in etc/cxlpool/cxlpoold.toml sbin/cxlpoold bin/cxlpoolctl lib/systemd/system/cxlpoold.service \
         lib/systemd/system/cxlpoold-metrics.socket share/man/man8/cxlpoold.8 \
         share/cxlpool/cxlpoold-sampling.conf; do
  [[ -e "$tmp/full/$f" ]] || { echo "not installed under the prefix: $f"; exit 1; }
done
[[ ! -e "$tmp/full/bin/cxlpool-example" ]] || { echo "an example binary was installed"; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" --component client >/dev/null
for f in include/cxlpool/cxlpool.h include/cxlpool/client.hpp lib/libcxlpool.a \
         lib/cmake/cxlpool/cxlpoolConfig.cmake lib/cmake/cxlpool/cxlpoolConfigVersion.cmake; do
  [[ -e "$tmp/prefix/$f" ]] || { echo "not installed: $f"; exit 1; }
done
libdir=$(dirname "$(find "$tmp/prefix" -name libcxlpool.so.0 | head -1)")
[[ -n "$libdir" ]] || { echo "libcxlpool.so.0 not installed"; exit 1; }

mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" <<CML
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
find_package(cxlpool 0.1 REQUIRED)
add_executable(c_shared $src/examples/cxlpool-example.c)
target_link_libraries(c_shared PRIVATE cxlpool::cxlpool)
add_executable(cpp_static $src/examples/cxlpool-example-cpp.cc)
target_link_libraries(cpp_static PRIVATE cxlpool::cxlpool_static)
set_target_properties(cpp_static PROPERTIES CXX_STANDARD 17)
CML
cmake -S "$tmp/consumer" -B "$tmp/consumer/b" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer/b" >/dev/null

expect_clean_failure() {
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  [[ $rc -eq 1 && $out == *"not found"* ]] || { echo "unexpected ($rc): $out"; exit 1; }
}
expect_clean_failure "$tmp/consumer/b/c_shared" --socket "$tmp/none.sock"
expect_clean_failure "$tmp/consumer/b/cpp_static" "$tmp/none.sock"
if ldd "$tmp/consumer/b/cpp_static" | grep -q libcxlpool; then
  echo "cpp_static links libcxlpool.so"; exit 1
fi

export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -std=c99 -o "$tmp/pc_example" "$src/examples/cxlpool-example.c" \
  $(pkg-config --cflags --libs cxlpool) -Wl,-rpath,"$libdir"
expect_clean_failure "$tmp/pc_example" --socket "$tmp/none.sock"
echo "packaging ok"
