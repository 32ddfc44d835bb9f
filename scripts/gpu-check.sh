#!/usr/bin/env bash
# GPU mode of cxlpool-bench (issue 5): builds cxlpool, compiles
# tools/bench/gpu/gpu_bench.cu with nvcc, starts a cxlpoold on a temp socket
# (pid tracked, killed at exit), and prints, each against its CUDA baseline in
# the same run:
#   H2D / D2H bandwidth of a registered lease vs cudaMallocHost   (>= 0.98x)
#   zero-copy kernel read through the lease's device pointer vs a
#   mapped cudaHostAlloc buffer                                   (>= 0.95x)
#   request -> registered 8 GiB lease vs cudaMallocHost(8 GiB)    (<= 0.5x)
# after checking that the GPU reads back what the CPU wrote into a lease.
#
# Usage: scripts/gpu-check.sh [--compile-only | --bundle DIR | --prebuilt DIR]
#   --compile-only  build everything and compile the .cu, then exit 0 (needs
#                   nvcc, no GPU).
#   --bundle DIR    the same, then pack cxlpoold, cxlpoolctl, cxlpool-bench,
#                   gpu_bench, libcxlpool and every shared library they need
#                   beyond the C and C++ runtimes into DIR (bin/, lib/, and
#                   this glibc's loader and libraries in lib/glibc/ as a
#                   fallback), for a GPU machine without the build
#                   dependencies. Needs nvcc, no GPU.
#   --prebuilt DIR  run from such a bundle instead of building.
# Environment: BUILD_DIR (default build), NVCC (default: nvcc on PATH, else
# /usr/local/cuda/bin/nvcc), CXLPOOL_GPU_BIG_GIB (8), CXLPOOL_GPU_BW_MIB
# (1024), CXLPOOL_GPU_BACKING (thp: memfd with MADV_HUGEPAGE when shmem THP
# is advise/always; 4k: small pages; hugetlb: 2 MiB hugetlb, which needs
# vm.nr_hugepages for BIG_GIB + BW_MIB), CXLPOOL_JOBS (nproc).
# Exit: 0 ran (read the verdicts), 77 no GPU (or no nvcc), 1 failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
BIG_GIB=${CXLPOOL_GPU_BIG_GIB:-8}
BW_MIB=${CXLPOOL_GPU_BW_MIB:-1024}
BACKING=${CXLPOOL_GPU_BACKING:-thp}
JOBS=${CXLPOOL_JOBS:-$(nproc)}
MODE=run
BUNDLE=
case ${1:-} in
  --compile-only) MODE=compile ;;
  --bundle) MODE=bundle; BUNDLE=${2:?--bundle needs a directory} ;;
  --prebuilt) MODE=prebuilt; BUNDLE=${2:?--prebuilt needs a directory} ;;
  "") ;;
  *) echo "usage: $0 [--compile-only | --bundle DIR | --prebuilt DIR]" >&2; exit 1 ;;
esac
case $BACKING in
  4k | thp | hugetlb) ;;
  *) echo "gpu-check: CXLPOOL_GPU_BACKING must be 4k, thp or hugetlb (not '$BACKING')" >&2; exit 1 ;;
esac

no_gpu() {
  echo "gpu-check: no GPU: $*" >&2
  exit 77
}

if [[ $MODE == run || $MODE == prebuilt ]]; then
  # Cheap checks first, so a GPU-less machine answers at once.
  compgen -G "/dev/nvidia[0-9]*" >/dev/null || no_gpu "no /dev/nvidia[0-9]* device on this machine"
  if command -v nvidia-smi >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then
    no_gpu "nvidia-smi -L lists no device: $(nvidia-smi -L 2>&1 | head -1)"
  fi
fi

if [[ $MODE == prebuilt ]]; then
  BUNDLE=$(cd "$BUNDLE" && pwd)
  BIN=$BUNDLE/bin
  export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Binaries built on a newer glibc than this machine's run under the
  # bundle's own loader and glibc.
  RUN=()
  if ! "$BIN/cxlpoolctl" --help >/dev/null 2>&1; then
    echo "gpu-check: this machine's glibc cannot run the bundle ($("$BIN/cxlpoolctl" --help 2>&1 | head -1)); using the bundle's glibc" >&2
    RUN=("$BUNDLE/lib/glibc/ld-linux-x86-64.so.2" --library-path "$BUNDLE/lib/glibc:$BUNDLE/lib")
    "${RUN[@]}" "$BIN/cxlpoolctl" --help >/dev/null
  fi
  DAEMON=("${RUN[@]}" "$BIN/cxlpoold")
  CTL=("${RUN[@]}" "$BIN/cxlpoolctl")
  GPU_BENCH=("${RUN[@]}" "$BIN/gpu_bench")
else
  NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [[ -x $NVCC ]] || no_gpu "nvcc not found (install the CUDA toolkit in /usr/local/cuda or set NVCC)"
  [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS" --target cxlpoold cxlpool cxlpoolctl cxlpool-bench
  mkdir -p "$BUILD_DIR/tools/bench"
  rpath=$ROOT/$BUILD_DIR/client_lib
  [[ $MODE == bundle ]] && rpath='$ORIGIN/../lib'
  "$NVCC" -O2 -std=c++17 -Werror all-warnings -I client_lib/include -o "$BUILD_DIR/tools/bench/gpu_bench" \
    tools/bench/gpu/gpu_bench.cu -L "$BUILD_DIR/client_lib" -lcxlpool \
    -Xlinker -rpath -Xlinker "$rpath"
  echo "gpu-check: compiled $BUILD_DIR/tools/bench/gpu_bench"
  [[ $MODE == compile ]] && exit 0
  if [[ $MODE == bundle ]]; then
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE/bin" "$BUNDLE/lib/glibc"
    bins=("$BUILD_DIR/daemon/cxlpoold" "$BUILD_DIR/tools/cxlpoolctl"
          "$BUILD_DIR/tools/bench/cxlpool-bench" "$BUILD_DIR/tools/bench/gpu_bench")
    for b in "${bins[@]}"; do
      objcopy --strip-debug "$b" "$BUNDLE/bin/$(basename "$b")"
    done
    # Every library the loader resolves, by its soname; the C/C++ runtime
    # (glibc, libstdc++, libgcc_s) is left to the target machine, glibc also
    # kept aside for the fallback above.
    objcopy --strip-debug "$BUILD_DIR/client_lib/libcxlpool.so.0" "$BUNDLE/lib/libcxlpool.so.0"
    ldd "${bins[@]}" "$BUILD_DIR/client_lib/libcxlpool.so.0" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
      while read -r soname path; do
        case $soname in
          libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.*)
            cp -L "$path" "$BUNDLE/lib/glibc/$soname" ;;
          libstdc++.so.* | libgcc_s.so.*) ;;
          *) objcopy --strip-debug "$path" "$BUNDLE/lib/$soname" 2>/dev/null || cp -L "$path" "$BUNDLE/lib/$soname" ;;
        esac
      done
    cp -L /lib64/ld-linux-x86-64.so.2 "$BUNDLE/lib/glibc/"
    git rev-parse --short HEAD >"$BUNDLE/COMMIT" 2>/dev/null || true
    echo "gpu-check: bundle in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)); run it with: scripts/gpu-check.sh --prebuilt $BUNDLE"
    exit 0
  fi
  DAEMON=("$BUILD_DIR/daemon/cxlpoold")
  CTL=("$BUILD_DIR/tools/cxlpoolctl")
  GPU_BENCH=("$BUILD_DIR/tools/bench/gpu_bench")
fi

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

thp=true hugetlb=false bench_args=()
case $BACKING in
  4k) thp=false ;;
  hugetlb) hugetlb=true; bench_args+=(--hugetlb) ;;
  thp)
    shmem=$(cat /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null || echo "unknown")
    [[ $shmem == *"[advise]"* || $shmem == *"[always]"* ]] ||
      echo "gpu-check: shmem THP is '$shmem', not advise/always: leases fall back to 4 KiB pages" >&2
    ;;
esac
# A warm reserve of the big size, so the timed request is the grant path.
cat >"$TMP/cxlpoold.toml" <<CONF
[daemon]
socket_mode = "0600"
log_level = "warning"
[pools]
capacity = "90%"
thp = $thp
hugetlb = $hugetlb
reserve_low = "${BIG_GIB}G"
reserve_high = "${BIG_GIB}G"
CONF
SOCK=$TMP/cxlpool.sock
ulimit -l unlimited 2>/dev/null || true
"${DAEMON[@]}" --config "$TMP/cxlpoold.toml" --socket "$SOCK" --state-dir "$TMP/state" \
  --foreground >"$TMP/cxlpoold.log" 2>&1 &
DAEMON_PID=$!

# Ready = no build in flight and the warm reserve holds the big size. A reserve that could
# not be built (pool too small, no huge pages) is said here, not later.
ready=0 short=0
for _ in $(seq 1200); do  # up to 120 s: the reserve prefaults BIG_GIB
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/cxlpoold.log" >&2; echo "gpu-check: cxlpoold exited" >&2; exit 1; }
  if [[ -S $SOCK ]] && stats=$("${CTL[@]}" stats --socket "$SOCK" --json 2>/dev/null); then
    pending=$(grep -Eo '"pending_builds": *[0-9]+' <<<"$stats" | grep -Eo '[0-9]+$' || echo 1)
    warm=$(grep -Eo '"reserve_ready_bytes": *[0-9]+' <<<"$stats" | grep -Eo '[0-9]+$' || echo 0)
    if [[ $pending == 0 && $warm -ge $((BIG_GIB << 30)) ]]; then
      ready=1
      break
    fi
    # Nothing in flight and still short for 3 s: it will not come.
    if [[ $pending == 0 ]] && ((++short >= 30)); then
      "${CTL[@]}" pools --socket "$SOCK" >&2 || true
      tail -5 "$TMP/cxlpoold.log" >&2
      echo "gpu-check: the ${BIG_GIB} GiB warm reserve was not built (${warm} B ready; see the pools above): lower CXLPOOL_GPU_BIG_GIB or free memory" >&2
      exit 1
    fi
  fi
  sleep 0.1
done
[[ $ready == 1 ]] || { tail -20 "$TMP/cxlpoold.log" >&2; echo "gpu-check: daemon not ready in 120 s" >&2; exit 1; }
echo "gpu-check: backing $BACKING; the daemon's view of the node:"
"${CTL[@]}" topology 2>&1 | sed 's/^/  /' || true

rc=0
timeout 300 "${GPU_BENCH[@]}" --socket "$SOCK" --big-gib "$BIG_GIB" --bw-mib "$BW_MIB" \
  "${bench_args[@]}" || rc=$?
if [[ $rc == 77 ]]; then
  no_gpu "the CUDA runtime sees no device"
elif [[ $rc != 0 ]]; then
  tail -20 "$TMP/cxlpoold.log" >&2
  echo "gpu-check: gpu_bench failed (exit $rc)" >&2
  exit 1
fi
grep -E '^[WE] ' "$TMP/cxlpoold.log" | head -20 | sed 's/^/gpu-check: daemon log: /' || true
