#!/usr/bin/env bash
# GPU check of the Python side (issue 19): PyTorch's pinned memory served by
# cxlpool, measured against PyTorch's own pinned memory in the same run.
#   * unmodified pin_memory() / torch.empty(pin_memory=True) / DataLoader pins
#     through cxlpool.torch.use_as_pinned_allocator() (the PyTorch >= 2.8
#     extension, built here), and through LD_PRELOAD=libcxlpool_preload.so,
#     each listed in `cxlpoolctl leases`;
#   * H2D and D2H bandwidth from those tensors vs PyTorch's      (>= 0.98x)
#   * committed host memory for PyTorch-like request sizes vs
#     requested (PyTorch's own figure beside it)                 (<= 1.01x)
#   * time to an 8 GiB pinned tensor vs PyTorch's                (<= 0.2x)
#   * examples/kv_cache_pool.py's two processes on the GPU.
# The phases run as separate processes (a pinned allocator is process-wide):
# scripts/gpu_torch_check.py does the measuring.
#
# Usage: scripts/gpu-torch-check.sh [--bundle DIR | --prebuilt DIR]
#   (none)          build with CMake here, then run
#   --bundle DIR    on the build machine: build cxlpoold, cxlpoolctl,
#                   libcxlpool and libcxlpool_preload and pack them with the
#                   shared libraries they need into DIR (no GPU needed)
#   --prebuilt DIR  on the GPU machine: run from such a bundle; the Python
#                   extensions are compiled there (scripts/build-python-ext.sh:
#                   a C++ compiler, the Python headers, pybind11 or PyTorch's
#                   copy of it)
# Environment: PYTHON (python3, the one with PyTorch), BUILD_DIR (build),
# CXLPOOL_GPU_BIG_GIB (8), CXLPOOL_GPU_BW_MIB (1024), CXLPOOL_JOBS (nproc).
# Exit: 0 ran and every check passed (read the verdicts for the ratios),
# 77 no GPU (or no PyTorch, or PyTorch sees no device), 1 failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
PY=${PYTHON:-python3}
BIG_GIB=${CXLPOOL_GPU_BIG_GIB:-8}
JOBS=${CXLPOOL_JOBS:-$(nproc)}
MODE=run
BUNDLE=
case ${1:-} in
  --bundle) MODE=bundle; BUNDLE=${2:?--bundle needs a directory} ;;
  --prebuilt) MODE=prebuilt; BUNDLE=${2:?--prebuilt needs a directory} ;;
  "") ;;
  *) echo "usage: $0 [--bundle DIR | --prebuilt DIR]" >&2; exit 1 ;;
esac
say() { echo "gpu-torch-check: $*" >&2; }
no_gpu() {
  say "no GPU: $*"
  exit 77
}

if [[ $MODE != bundle ]]; then
  # Cheap checks first, so a GPU-less machine answers at once.
  compgen -G "/dev/nvidia[0-9]*" >/dev/null || no_gpu "no /dev/nvidia[0-9]* device on this machine"
  if command -v nvidia-smi >/dev/null && ! nvidia-smi -L >/dev/null 2>&1; then
    no_gpu "nvidia-smi -L lists no device: $(nvidia-smi -L 2>&1 | head -1)"
  fi
  command -v "$PY" >/dev/null || no_gpu "no $PY"
  "$PY" -c "import torch" 2>/dev/null || no_gpu "$PY cannot import torch: $("$PY" -c 'import torch' 2>&1 | tail -1)"
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" ||
    no_gpu "PyTorch $("$PY" -c 'import torch; print(torch.__version__)') sees no CUDA device"
fi

if [[ $MODE == bundle || $MODE == run ]]; then
  [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS" --target cxlpoold cxlpoolctl cxlpool cxlpool_preload
fi
if [[ $MODE == bundle ]]; then
  # bin/ and lib/: the daemon and the CLI with what they load; lib/client/:
  # libcxlpool, the preload shim and theirs, the only libraries the Python
  # processes get (nothing there shadows what the interpreter itself loads).
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE/bin" "$BUNDLE/lib/client"
  objcopy --strip-debug "$BUILD_DIR/daemon/cxlpoold" "$BUNDLE/bin/cxlpoold"
  objcopy --strip-debug "$BUILD_DIR/tools/cxlpoolctl" "$BUNDLE/bin/cxlpoolctl"
  objcopy --strip-debug "$BUILD_DIR/client_lib/libcxlpool.so.0" "$BUNDLE/lib/client/libcxlpool.so.0"
  objcopy --strip-debug "$BUILD_DIR/client_lib/preload/libcxlpool_preload.so" \
    "$BUNDLE/lib/client/libcxlpool_preload.so"
  pack() {  # pack DEST FILE...: every library they load beyond the C and C++ runtimes
    local dest=$1
    shift
    ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
      while read -r soname path; do
        case $soname in
          libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libstdc++.so.* | libgcc_s.so.*) ;;
          libcxlpool.so.*) ;;
          *) cp -L "$path" "$dest/$soname" ;;
        esac
      done
  }
  pack "$BUNDLE/lib" "$BUNDLE"/bin/*
  pack "$BUNDLE/lib/client" "$BUNDLE"/lib/client/*.so*
  git rev-parse --short HEAD >"$BUNDLE/COMMIT" 2>/dev/null || true
  say "bundle in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)); on the GPU machine: scripts/gpu-torch-check.sh --prebuilt $BUNDLE"
  exit 0
fi

TMP=$(mktemp -d /tmp/cxlpool-gpu-torch-XXXXXX)
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
if [[ $MODE == prebuilt ]]; then
  BUNDLE=$(cd "$BUNDLE" && pwd)
  LIB=$BUNDLE/lib/client PRELOAD=$BUNDLE/lib/client/libcxlpool_preload.so BIN=$TMP/bin
  mkdir -p "$BIN"
  for b in cxlpoold cxlpoolctl; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$BUNDLE/lib:$BUNDLE/lib/client" "$BUNDLE/bin/$b" >"$BIN/$b"
    chmod +x "$BIN/$b"
  done
  # The Python processes: libcxlpool's own dependencies only.
  export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  BIN=$TMP/bin LIB=$ROOT/$BUILD_DIR/client_lib PRELOAD=$ROOT/$BUILD_DIR/client_lib/preload/libcxlpool_preload.so
  mkdir -p "$BIN"
  ln -sf "$ROOT/$BUILD_DIR/daemon/cxlpoold" "$BIN/cxlpoold"
  ln -sf "$ROOT/$BUILD_DIR/tools/cxlpoolctl" "$BIN/cxlpoolctl"
fi
"$BIN/cxlpoolctl" --help >/dev/null 2>&1 || { say "cannot run $BIN/cxlpoolctl: $("$BIN/cxlpoolctl" --help 2>&1 | head -1)"; exit 1; }


# The Python package and the allocator extension, for this interpreter.
PYTHON=$PY scripts/build-python-ext.sh "$TMP/py" "$LIB"
export PYTHONPATH=$TMP/py${PYTHONPATH:+:$PYTHONPATH}

cat >"$TMP/cxlpoold.toml" <<CONF
[daemon]
socket_mode = "0600"
log_level = "warning"
[pools]
capacity = "90%"
thp = true
reserve_low = "${BIG_GIB}G"
reserve_high = "${BIG_GIB}G"
CONF
export CXLPOOL_SOCKET=$TMP/cxlpool.sock
export CXLPOOL_CTL=$BIN/cxlpoolctl
ulimit -l unlimited 2>/dev/null || true
"$BIN/cxlpoold" --config "$TMP/cxlpoold.toml" --socket "$CXLPOOL_SOCKET" --state-dir "$TMP/state" \
  --foreground >"$TMP/cxlpoold.log" 2>&1 &
DAEMON_PID=$!

# Ready = nothing being built and the warm reserve holds the big size.
wait_ready() {
  local short=0
  for _ in $(seq 1200); do
    kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/cxlpoold.log" >&2; say "cxlpoold exited"; exit 1; }
    if [[ -S $CXLPOOL_SOCKET ]] && stats=$("$CXLPOOL_CTL" stats --socket "$CXLPOOL_SOCKET" --json 2>/dev/null); then
      pending=$(grep -Eo '"pending_builds": *[0-9]+' <<<"$stats" | grep -Eo '[0-9]+$' || echo 1)
      warm=$(grep -Eo '"reserve_ready_bytes": *[0-9]+' <<<"$stats" | grep -Eo '[0-9]+$' || echo 0)
      [[ $pending == 0 && $warm -ge $((BIG_GIB << 30)) ]] && return 0
      if [[ $pending == 0 ]] && ((++short >= 50)); then
        "$CXLPOOL_CTL" pools --socket "$CXLPOOL_SOCKET" >&2 || true
        say "the ${BIG_GIB} GiB warm reserve was not built: lower CXLPOOL_GPU_BIG_GIB or free memory"
        exit 1
      fi
    fi
    sleep 0.1
  done
  say "daemon not ready in 120 s"
  exit 1
}

phase() {  # phase NAME [env...]
  local name=$1
  shift
  wait_ready
  say "phase $name"
  local rc=0
  env "$@" timeout 180 "$PY" scripts/gpu_torch_check.py "$name" "$TMP/$name.json" || rc=$?
  if [[ $rc == 77 ]]; then no_gpu "PyTorch sees no CUDA device"; fi
  if [[ $rc != 0 ]]; then tail -20 "$TMP/cxlpoold.log" >&2; say "phase $name failed (exit $rc)"; exit 1; fi
}

phase baseline
if [[ -f $TMP/py/cxlpool/_torch_host_allocator.so ]]; then
  phase allocator
else
  say "phase allocator skipped: the extension was not built (see build-python-ext above)"
fi
phase shim "LD_PRELOAD=$PRELOAD"
wait_ready
say "examples/kv_cache_pool.py on the GPU"
kv=$(timeout 180 "$PY" examples/kv_cache_pool.py --blocks 512 --sequences 16 2>&1) || { echo "$kv" >&2; say "KV example failed"; exit 1; }
echo "$kv" | sed 's/^/  /' >&2
grep -q "verified (GPU path" <<<"$kv" || { say "the KV example did not take the GPU path"; exit 1; }
"$PY" scripts/gpu_torch_check.py report "$TMP"/*.json
grep -E '^[WE] ' "$TMP/cxlpoold.log" | head -20 | sed 's/^/gpu-torch-check: daemon log: /' >&2 || true
