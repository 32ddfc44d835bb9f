#!/usr/bin/env bash
# Builds the cxlpool Python package without CMake: only a C++ compiler, the
# interpreter's headers, pybind11 (pip's `python -m pybind11`, Debian's
# /usr/include/pybind11, or the copy PyTorch ships) and, for the pinned-
# memory allocator extension, PyTorch >= 2.8. For machines that have PyTorch
# but not the project's build dependencies (scripts/gpu-torch-check.sh).
#
#   scripts/build-python-ext.sh OUT_DIR [LIBDIR]
#
# OUT_DIR/cxlpool/ gets the package's .py and .pyi files, _cxlpool<suffix>
# and, where PyTorch >= 2.8 is importable, _torch_host_allocator.so. LIBDIR
# holds libcxlpool.so.0 (default build/client_lib); both extensions find it
# there through their RPATH. Environment: PYTHON (python3), CXX (c++).
# Exit: 0 built (the allocator extension may be skipped, said on stderr),
# 1 failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:?usage: $0 OUT_DIR [LIBDIR]}
LIBDIR=${2:-build/client_lib}
PY=${PYTHON:-python3}
CXX=${CXX:-c++}
say() { echo "build-python-ext: $*" >&2; }
command -v "$CXX" >/dev/null || { say "no C++ compiler ($CXX)"; exit 1; }
[[ -e $LIBDIR/libcxlpool.so.0 ]] || { say "no libcxlpool.so.0 in $LIBDIR"; exit 1; }
LIBDIR=$(cd "$LIBDIR" && pwd)
mkdir -p "$OUT/cxlpool"
OUT=$(cd "$OUT" && pwd)
cp python/cxlpool/*.py python/cxlpool/*.pyi python/cxlpool/py.typed "$OUT/cxlpool/"

suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
pyinc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
[[ -f $pyinc/Python.h ]] || { say "no Python.h in $pyinc: install $PY's development headers"; exit 1; }
torch_inc=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))" 2>/dev/null || true)
pybind_inc=
if inc=$("$PY" -m pybind11 --includes 2>/dev/null); then
  pybind_inc=$inc
elif [[ -f /usr/include/pybind11/pybind11.h ]]; then
  pybind_inc="-I$pyinc"
elif [[ -n $torch_inc && -f $torch_inc/pybind11/pybind11.h ]]; then
  pybind_inc="-I$pyinc -isystem $torch_inc"
else
  say "no pybind11 headers (pip install pybind11, apt-get install pybind11-dev, or PyTorch's)"
  exit 1
fi
# shellcheck disable=SC2086
"$CXX" -O2 -std=c++20 -shared -fPIC -fvisibility=hidden $pybind_inc -I client_lib/include \
  python/src/module.cc "$LIBDIR/libcxlpool.so.0" -Wl,-rpath,"$LIBDIR" \
  -o "$OUT/cxlpool/_cxlpool$suffix"
say "built $OUT/cxlpool/_cxlpool$suffix"

# The allocator extension: PyTorch >= 2.8 with the C++11 string ABI.
info=$("$PY" - <<'PYEOF' 2>/dev/null || true
import os, torch
from torch.utils.cpp_extension import include_paths
v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
print("%d.%d" % v)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
print(" ".join("-isystem " + p for p in include_paths()))
PYEOF
)
if [[ -z $info ]]; then
  say "allocator extension skipped: $PY cannot import torch"
  exit 0
fi
{ read -r tv; read -r abi; read -r tlib; read -r tinc; } <<<"$info"
if [[ $(printf '%s\n2.8\n' "$tv" | sort -V | head -1) != 2.8 ]]; then
  say "allocator extension skipped: PyTorch $tv has no at::setHostAllocator (needs 2.8 or later)"
  exit 0
fi
if [[ $abi != 1 ]]; then
  say "allocator extension skipped: PyTorch $tv uses the pre-C++11 string ABI, libcxlpool the new one"
  exit 0
fi
# shellcheck disable=SC2086
"$CXX" -O2 -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -Wno-unused-parameter $tinc \
  -I client_lib/include -I client_lib/hostalloc -I common/include \
  python/csrc/torch_host_allocator.cc \
  client_lib/hostalloc/host_arena.cc "$LIBDIR/libcxlpool.so.0" -L "$tlib" -lc10 -ltorch_cpu \
  -Wl,-rpath,"$LIBDIR" -Wl,-rpath,"$tlib" -o "$OUT/cxlpool/_torch_host_allocator.so"
say "built $OUT/cxlpool/_torch_host_allocator.so against PyTorch $tv"
