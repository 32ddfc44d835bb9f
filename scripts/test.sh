#!/usr/bin/env bash
# Builds cxlpool and runs the whole test suite with ctest, in stages:
#   main     gcc build at -O3 with debug info (so the optimiser's own warnings,
#            e.g. GCC 12's -Wrestrict, are errors too); every ctest label:
#            unit, integration, cli, topology, systemd, vm (QEMU, incl. the
#            systemd guest), stress, bench, package (the Debian packages,
#            lintian)
#   asan     ASan+UBSan build at -O1 of what the unit and integration tests
#            run; those tests
#   tsan     TSan build of the threaded code's tests (server, client, lease
#            manager with its worker and stock threads, handler, the metrics
#            endpoint, a real daemon)
#   fuzz     clang libFuzzer+ASan+UBSan build; each fuzz target for
#            CXLPOOL_FUZZ_SECONDS (default 60)
# Every build has warnings as errors (CXLPOOL_WERROR=ON; a user's build has
# it off). Each step's time is printed as it ends and all of them at the end.
# Knobs: CXLPOOL_TEST_STAGES ("main asan tsan fuzz"), CXLPOOL_JOBS
#        (nproc), CXLPOOL_FUZZ_SECONDS, BUILD_DIR (main build folder, default
#        build), CXLPOOL_CMAKE_ARGS (extra arguments for the main build).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${CXLPOOL_JOBS:-$(nproc)}
STAGES=${CXLPOOL_TEST_STAGES:-main asan tsan fuzz}
BUILD_DIR=${BUILD_DIR:-build}
export CCACHE_BASEDIR=$PWD

# shellcheck source=lib/steps.sh
source scripts/lib/steps.sh
stage() { printf '\n'; step "$1"; }
trap 'step_summary $?' EXIT
has() { [[ " $STAGES " == *" $1 "* ]]; }
werror=-DCXLPOOL_WERROR=ON
for s in $STAGES; do
  case $s in
    main | asan | tsan | fuzz) ;;
    *) echo "test.sh: unknown stage '$s' in CXLPOOL_TEST_STAGES (main asan tsan fuzz)" >&2; exit 2 ;;
  esac
done

# The ninja targets that the tests chosen by ctest's arguments run: each
# test's name where it is a target, and every path into the build folder in
# its add_test command that names one (ctest itself shows no command for a
# binary not built yet). Building a target builds what it declares it
# depends on. Each stage builds exactly these, so a new test cannot be left
# unbuilt.
targets_for_tests() {
  local dir=$1 abs all names
  shift
  abs=$(cd "$dir" && pwd)
  all=$(ninja -C "$dir" -t targets all | sed -n 's/^\([^:]*\): phony$/\1/p')
  names=$(ctest --test-dir "$dir" -N "$@" | sed -n 's/^ *Test *#[0-9]*: //p')
  {
    echo "$names"
    find "$dir" -name CTestTestfile.cmake -exec cat {} + |
      awk -v names="$names" 'BEGIN { n = split(names, a, "\n")
                                     for (i = 1; i <= n; i++) want["add_test([=[" a[i] "]=]"] = 1 }
                             $1 in want' |
      grep -o "\"$abs/[^\"]*\"" | tr -d '"' | xargs -r -n1 basename
  } | sort -u | grep -xFf <(echo "$all")
}

if has main; then
  stage "main: build (-O3 -g)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $werror \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O3 -g -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O3 -g -DNDEBUG" ${CXLPOOL_CMAKE_ARGS:-}
  cmake --build "$BUILD_DIR" -j "$JOBS"
  stage "main: ctest (every label)"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
fi

if has asan; then
  stage "asan: build (address,undefined, -O1)"
  # -O1 and line tables only (-g1): what ASan's reports need, at about half
  # the compile time of -O2 -g.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $werror \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCXLPOOL_SANITIZE=address,undefined -DCXLPOOL_BUILD_BENCH=OFF
  asan_tests=(-L 'unit|integration' -LE 'vm|package|stress|bench|cli')
  mapfile -t asan_targets < <(targets_for_tests build-asan "${asan_tests[@]}")
  cmake --build build-asan -j "$JOBS" --target cxlpoold "${asan_targets[@]}"
  stage "asan: ctest (unit, integration)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:handle_sigbus=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS" "${asan_tests[@]}"
fi

if has fuzz; then
  stage "fuzz: build (clang, libFuzzer, address,undefined)"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $werror \
    -DCXLPOOL_FUZZ=ON -DCXLPOOL_SANITIZE=address,undefined -DCXLPOOL_BUILD_BENCH=OFF \
    -DCXLPOOL_BUILD_TESTS=ON -DCXLPOOL_FUZZ_SECONDS="${CXLPOOL_FUZZ_SECONDS:-60}"
  mapfile -t fuzz_targets < <(targets_for_tests build-fuzz -L fuzz)
  ((${#fuzz_targets[@]})) || { echo "no fuzz tests defined" >&2; exit 1; }
  cmake --build build-fuzz -j "$JOBS" --target "${fuzz_targets[@]}"
  stage "fuzz: run"
  ctest --test-dir build-fuzz --output-on-failure -j "$JOBS" -L fuzz
fi

if has tsan; then
  stage "tsan: build (clang, thread, -Wthread-safety)"
  CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $werror \
    -DCXLPOOL_SANITIZE=thread -DCXLPOOL_BUILD_BENCH=OFF
  # The code with threads: the Asio server, the client (mutex + watcher), the
  # lease manager with its worker pool, the metrics endpoint's own thread,
  # and real daemons under load.
  tsan_tests=(server_test client_test daemon_lease_test daemon_handler_test
              daemon_thread_priority_test daemon_http_test daemon_integration_test)
  regex=$(IFS='|'; echo "^(${tsan_tests[*]})$")
  mapfile -t tsan_targets < <(targets_for_tests build-tsan -R "$regex")
  cmake --build build-tsan -j "$JOBS" --target cxlpoold "${tsan_targets[@]}"
  stage "tsan: ctest"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:handle_sigbus=0 \
    ctest --test-dir build-tsan --output-on-failure -R "$regex"
fi
end_step
echo "==== done"
