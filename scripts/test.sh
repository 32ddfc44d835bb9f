#!/usr/bin/env bash
# Builds cxlpool and runs the whole test suite with ctest, in stages:
#   main   RelWithDebInfo build (gcc, -Werror); every ctest label: unit,
#          integration, topology, systemd, vm (QEMU), stress, bench, package
#   asan   ASan+UBSan build; unit and integration tests
#   fuzz   clang libFuzzer+ASan+UBSan build; each fuzz target for
#          CXLPOOL_FUZZ_SECONDS (default 60)
#   tsan   TSan build of the threaded code's tests (server, client, lease
#          manager with its worker and stock threads, handler, a real daemon)
# Knobs: CXLPOOL_TEST_STAGES ("main asan tsan fuzz"), CXLPOOL_JOBS (nproc),
#        CXLPOOL_FUZZ_SECONDS, BUILD_DIR (main build folder, default build).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${CXLPOOL_JOBS:-$(nproc)}
STAGES=${CXLPOOL_TEST_STAGES:-main asan tsan fuzz}
BUILD_DIR=${BUILD_DIR:-build}
export CCACHE_BASEDIR=$PWD

stage() { printf '\n==== %s (%s)\n' "$1" "$(date +%T)"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has main; then
  stage "main: build"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CXLPOOL_CMAKE_ARGS:-}
  cmake --build "$BUILD_DIR" -j "$JOBS"
  stage "main: ctest"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
fi

if has asan; then
  stage "asan: build (address,undefined)"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCXLPOOL_SANITIZE=address,undefined -DCXLPOOL_BUILD_BENCH=OFF
  cmake --build build-asan -j "$JOBS"
  stage "asan: ctest (unit, integration)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:handle_sigbus=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L 'unit|integration' \
    -LE 'vm|package|stress|bench'
fi

if has fuzz; then
  stage "fuzz: build (clang, libFuzzer, address,undefined)"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCXLPOOL_FUZZ=ON -DCXLPOOL_SANITIZE=address,undefined -DCXLPOOL_BUILD_BENCH=OFF \
    -DCXLPOOL_BUILD_TESTS=ON -DCXLPOOL_FUZZ_SECONDS="${CXLPOOL_FUZZ_SECONDS:-60}"
  # Build exactly the targets behind the fuzz-labelled tests (each test is
  # named after its fuzzer), so a new fuzzer cannot be left unbuilt.
  mapfile -t fuzz_targets < <(ctest --test-dir build-fuzz -N -L fuzz |
    sed -n 's/^ *Test *#[0-9]*: \(fuzz_[a-z_]*\)$/\1/p')
  ((${#fuzz_targets[@]})) || { echo "no fuzz tests defined" >&2; exit 1; }
  cmake --build build-fuzz -j "$JOBS" --target "${fuzz_targets[@]}"
  stage "fuzz: run"
  ctest --test-dir build-fuzz --output-on-failure -L fuzz
fi

if has tsan; then
  stage "tsan: build (thread)"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCXLPOOL_SANITIZE=thread -DCXLPOOL_BUILD_BENCH=OFF
  # The code with threads: the Asio server, the client (mutex + watcher), the
  # lease manager with its worker pool, and real daemons under load.
  tsan_tests=(server_test client_test daemon_lease_test daemon_handler_test
              daemon_thread_priority_test daemon_integration_test)
  available=$(ninja -C build-tsan -t targets all | sed -n 's/^\([a-z_]*_test\): phony$/\1/p')
  targets=(cxlpoold)
  for t in "${tsan_tests[@]}"; do grep -qx "$t" <<<"$available" && targets+=("$t"); done
  cmake --build build-tsan -j "$JOBS" --target "${targets[@]}"
  stage "tsan: ctest"
  regex=$(IFS='|'; echo "^(${tsan_tests[*]})$")
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:handle_sigbus=0 \
    ctest --test-dir build-tsan --output-on-failure -R "$regex"
fi
stage "done"
