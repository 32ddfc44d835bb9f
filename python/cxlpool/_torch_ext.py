"""Loads the PyTorch host-allocator extension (csrc/torch_host_allocator.cc).

The extension is a plain shared library with a small C interface (no Python
headers), built against PyTorch >= 2.8 by CMake where such a PyTorch is
installed, or by scripts/build-python-ext.sh. It is looked up at
``$CXLPOOL_TORCH_EXT``, else next to this file as
``_torch_host_allocator.so``.
"""

from __future__ import annotations

import ctypes
import os
import threading

from .errors import ErrorCode, _from_code

STAT_KEYS = (
    "requested_bytes",
    "leased_bytes",
    "large_leases",
    "slabs",
    "small_blocks",
    "allocations",
    "failures",
    "deferred_frees",
)

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def path() -> str:
    """Where the extension is expected."""
    env = os.environ.get("CXLPOOL_TORCH_EXT")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_host_allocator.so")


def _torch_version() -> tuple[int, int]:
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def loaded() -> ctypes.CDLL | None:
    """The extension if load() succeeded, else None."""
    return _lib


def load() -> ctypes.CDLL:
    """Loads the extension (once). UnsupportedError: PyTorch < 2.8, or not built."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        import torch

        major, minor = _torch_version()
        if (major, minor) < (2, 8):
            raise _from_code(
                ErrorCode.UNSUPPORTED,
                f"PyTorch {torch.__version__} has no pluggable CUDA host allocator "
                "(at::setHostAllocator needs 2.8 or later); use cxlpool.torch.empty() "
                "or LD_PRELOAD=libcxlpool_preload.so instead",
            )
        p = path()
        if not os.path.exists(p):
            raise _from_code(
                ErrorCode.UNSUPPORTED,
                f"the host-allocator extension is not built ({p} missing): build it with "
                "scripts/build-python-ext.sh, or set CXLPOOL_TORCH_EXT",
            )
        lib = ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
        lib.cxlpool_torch_install.restype = ctypes.c_int
        lib.cxlpool_torch_install.argtypes = [
            ctypes.c_char_p,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.cxlpool_torch_installed.restype = ctypes.c_int
        lib.cxlpool_torch_stats.restype = ctypes.c_int
        lib.cxlpool_torch_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        lib.cxlpool_torch_lease_id.restype = ctypes.c_uint64
        lib.cxlpool_torch_lease_id.argtypes = [ctypes.c_void_p]
        _lib = lib
        return lib
