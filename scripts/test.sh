#!/usr/bin/env bash
# Builds cxlpool and runs the whole test suite with ctest.
# Environment knobs:
#   BUILD_DIR      build folder (default: build)
#   CXLPOOL_JOBS   parallel build jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${CXLPOOL_JOBS:-$(nproc)}

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CXLPOOL_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
