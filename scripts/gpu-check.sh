#!/usr/bin/env bash
# GPU mode of cxlpool-bench (issue 5): builds cxlpool, compiles
# tools/bench/gpu/gpu_bench.cu with nvcc, starts a cxlpoold on a temp socket
# (pid tracked, killed at exit), and prints, each against its CUDA baseline in
# the same run:
#   H2D / D2H bandwidth of a registered lease vs cudaMallocHost   (>= 0.98x)
#   zero-copy kernel read through the lease's device pointer vs a
#   mapped cudaHostAlloc buffer                                   (>= 0.95x)
#   request -> registered 8 GiB lease vs cudaMallocHost(8 GiB)    (<= 0.5x)
#
# Usage: scripts/gpu-check.sh [--compile-only]
# Environment: BUILD_DIR (default build), NVCC (default: nvcc on PATH, else
# /usr/local/cuda/bin/nvcc), CXLPOOL_GPU_BIG_GIB (8), CXLPOOL_GPU_BW_MIB (1024),
# CXLPOOL_JOBS (nproc).
# Exit: 0 ran (read the verdicts), 77 no GPU (or no nvcc), 1 failure.
# --compile-only builds everything and compiles the .cu, then exits 0; it
# needs nvcc but no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
BIG_GIB=${CXLPOOL_GPU_BIG_GIB:-8}
BW_MIB=${CXLPOOL_GPU_BW_MIB:-1024}
JOBS=${CXLPOOL_JOBS:-$(nproc)}
COMPILE_ONLY=0
[[ ${1:-} == --compile-only ]] && COMPILE_ONLY=1

no_gpu() {
  echo "gpu-check: no GPU: $*" >&2
  exit 77
}

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[[ -x $NVCC ]] || no_gpu "nvcc not found (install the CUDA toolkit in /usr/local/cuda or set NVCC)"

if [[ $COMPILE_ONLY == 0 ]]; then
  # Cheap checks first, so a GPU-less machine answers at once.
  compgen -G "/dev/nvidia[0-9]*" >/dev/null || no_gpu "no /dev/nvidia[0-9]* device on this machine"
  if command -v nvidia-smi >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then
    no_gpu "nvidia-smi -L lists no device: $(nvidia-smi -L 2>&1 | head -1)"
  fi
fi

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target cxlpoold cxlpool cxlpoolctl
mkdir -p "$BUILD_DIR/tools/bench"
GPU_BENCH=$BUILD_DIR/tools/bench/gpu_bench
"$NVCC" -O2 -std=c++17 -I client_lib/include -o "$GPU_BENCH" tools/bench/gpu/gpu_bench.cu \
  -L "$BUILD_DIR/client_lib" -lcxlpool -Xlinker -rpath -Xlinker "$ROOT/$BUILD_DIR/client_lib"
echo "gpu-check: compiled $GPU_BENCH"
[[ $COMPILE_ONLY == 1 ]] && exit 0

TMP=$(mktemp -d /tmp/cxlpool-gpu-XXXXXX)
DAEMON_PID=
cleanup() {
  if [[ -n $DAEMON_PID ]]; then
    kill -TERM "$DAEMON_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# One warm lease of the big size, so the timed request is the grant path.
cat >"$TMP/cxlpoold.toml" <<EOF
[daemon]
socket_mode = "0600"
log_level = "warning"
[pools]
capacity = "90%"
warm_stock = [{ size = "${BIG_GIB}G", count = 1 }]
EOF
SOCK=$TMP/cxlpool.sock
ulimit -l unlimited 2>/dev/null || true
"$BUILD_DIR/daemon/cxlpoold" --config "$TMP/cxlpoold.toml" --socket "$SOCK" --foreground \
  >"$TMP/cxlpoold.log" 2>&1 &
DAEMON_PID=$!

ready=0
for _ in $(seq 1200); do  # up to 120 s: the warm stock prefaults BIG_GIB
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/cxlpoold.log" >&2; echo "gpu-check: cxlpoold exited" >&2; exit 1; }
  if [[ -S $SOCK ]] &&
     "$BUILD_DIR/tools/cxlpoolctl" stats --socket "$SOCK" --json 2>/dev/null |
       grep -Eq '"pending_builds": *0([^0-9]|$)'; then
    ready=1
    break
  fi
  sleep 0.1
done
[[ $ready == 1 ]] || { tail -20 "$TMP/cxlpoold.log" >&2; echo "gpu-check: daemon not ready in 120 s" >&2; exit 1; }

rc=0
timeout 300 "$GPU_BENCH" --socket "$SOCK" --big-gib "$BIG_GIB" --bw-mib "$BW_MIB" || rc=$?
if [[ $rc == 77 ]]; then
  no_gpu "the CUDA runtime sees no device"
elif [[ $rc != 0 ]]; then
  tail -20 "$TMP/cxlpoold.log" >&2
  echo "gpu-check: gpu_bench failed (exit $rc)" >&2
  exit 1
fi
