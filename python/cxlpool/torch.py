"""PyTorch tensors backed by cxlpool leases, and PyTorch's pinned-memory
allocator served from the pool.

    import torch, cxlpool.torch as ct
    x = ct.empty((4096, 4096), dtype=torch.float16)          # near the current GPU
    x.is_pinned()                                            # True where a GPU is
    y = x.to("cuda", non_blocking=True)                      # asynchronous copy
    kv = ct.empty((64, 2, 16, 128), torch.bfloat16, name="kv", tier="cxl")
    w = ct.empty(1 << 20, torch.uint8, register=False)       # map, don't register

Each tensor's storage is the lease: the lease is released when the last
tensor or view sharing that storage is gone (and when the process dies,
however it dies). Where CUDA has a device, the lease is registered with CUDA
on the GPU it was placed near (cuMemHostRegister, DEVICEMAP|PORTABLE), so the
tensor is pinned memory to PyTorch: ``is_pinned()`` is True and
``.to('cuda', non_blocking=True)`` is an asynchronous DMA. ``register=False``
("map, don't register") leaves registration to engines that call
cudaHostRegister themselves (vLLM, SGLang).

``use_as_pinned_allocator()`` (PyTorch >= 2.8, with the extension built)
makes every ``pin_memory()``, ``torch.empty(..., pin_memory=True)`` and
DataLoader pin come from exact-size leases near the current device.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from typing import Any, Iterable, Sequence

import torch as _torch
from torch.utils import dlpack as _dlpack

from . import Client, Lease
from .errors import ErrorCode, UnsupportedError, _from_code
from . import _torch_ext

__all__ = [
    "empty",
    "zeros",
    "ones",
    "full",
    "empty_like",
    "zeros_like",
    "pin",
    "attach",
    "lease_of",
    "set_client",
    "get_client",
    "use_as_pinned_allocator",
    "pinned_allocator_installed",
    "pinned_allocator_stats",
]

_lock = threading.Lock()
_client: Client | None = None
# Storage data pointer -> the Lease behind it (weak: the storage owns it).
_leases: "weakref.WeakValueDictionary[int, Lease]" = weakref.WeakValueDictionary()


def set_client(client: Client | None) -> None:
    """Uses ``client`` for the tensors made from now on (None: connect anew
    to the default socket on next use)."""
    global _client
    with _lock:
        _client = client


def get_client() -> Client:
    """The module's client, connected on first use (``$CXLPOOL_SOCKET`` or
    the default socket)."""
    global _client
    with _lock:
        if _client is None or not _client.connected:
            _client = Client()
        return _client


def _shape(shape: tuple) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, _torch.Size)):
        shape = tuple(shape[0])
    out = tuple(int(s) for s in shape)
    if any(s < 0 for s in out):
        raise _from_code(ErrorCode.INVALID_ARGUMENT, f"negative dimension in shape {out}")
    return out


def _device_index(near_gpu: Any) -> int:
    """-1 for no GPU, else a CUDA device index."""
    if near_gpu is None:
        if _torch.cuda.is_available():
            return int(_torch.cuda.current_device())
        return -1
    if isinstance(near_gpu, _torch.device):
        if near_gpu.type != "cuda":
            raise _from_code(ErrorCode.INVALID_ARGUMENT, f"near_gpu: {near_gpu} is not a CUDA device")
        return int(near_gpu.index if near_gpu.index is not None else _torch.cuda.current_device())
    if isinstance(near_gpu, str):
        return _device_index(_torch.device(near_gpu))
    index = int(near_gpu)
    if index < -1:
        raise _from_code(ErrorCode.INVALID_ARGUMENT, "near_gpu must be >= 0, -1 or None")
    return index


def _storage_ptr(t: _torch.Tensor) -> int:
    if hasattr(t, "untyped_storage"):
        return int(t.untyped_storage().data_ptr())
    return int(t.storage().data_ptr())


def _tensor_over(lease: Lease, nbytes: int, dtype: _torch.dtype, shape: tuple[int, ...]) -> _torch.Tensor:
    """A tensor of `shape` and `dtype` over the first `nbytes` of the lease;
    its storage holds the lease."""
    raw = _dlpack.from_dlpack(lease.window(0, nbytes))
    t = raw if dtype == _torch.uint8 else raw.view(dtype)
    t = t.view(shape)
    _leases[_storage_ptr(t)] = lease
    return t


def _ensure_registered(lease: Lease, device: int, register: bool) -> None:
    if not register:
        return
    if not lease.device_chunks:
        try:
            lease.device_ptr  # raises the registration's error
        except Exception:
            lease.release()
            raise
        lease.release()
        raise _from_code(ErrorCode.INTERNAL, f"lease not registered on device {device}")


def empty(
    *shape: Any,
    dtype: _torch.dtype | None = None,
    near_gpu: Any = None,
    tier: str | Sequence[str] | None = None,
    name: str | None = None,
    numa_node: int | None = None,
    gpu: str | None = None,
    strict: bool = False,
    hugetlb: bool = False,
    register: bool | None = None,
    label: str = "torch",
    acl_uids: Iterable[int] | None = None,
    acl_gids: Iterable[int] | None = None,
    client: Client | None = None,
    long_term_pin: bool | None = None,
) -> _torch.Tensor:
    """An uninitialised CPU tensor in a lease of exactly its size.

    near_gpu: device index, ``torch.device('cuda:N')`` or None (the current
    CUDA device when there is one, else no GPU). tier: node kinds in order of
    preference (``"cxl"``, ``["dram", "cxl"]``). name: make it a shared named
    lease others can ``attach()`` (ACL: acl_uids / acl_gids). register:
    register with CUDA (None: when a GPU is there; False: map, don't
    register). long_term_pin: the memory will be pinned long-term (None: when
    it is for a GPU, registered here or by the engine in map-don't-register
    mode), so the daemon keeps it off memory a pin would move it from; call
    ``lease_of(t).verify()`` after pinning it yourself. numa_node, gpu,
    strict, hugetlb, label: as Client.allocate.
    Raises cxlpool.Error subclasses (ResourceExhaustedError for a full pool
    or quota, UnavailableError without a daemon, ...).
    """
    dims = _shape(shape)
    dtype = dtype or _torch.get_default_dtype()
    itemsize = _torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(dims) * itemsize
    device = _device_index(near_gpu)
    if register is None:
        register = device >= 0
    if register and device < 0:
        device = 0
    if long_term_pin is None:
        long_term_pin = device >= 0
    cl = client or get_client()
    lease = cl.allocate(
        max(nbytes, 1),
        numa_node=numa_node,
        near_gpu=device if device >= 0 else None,
        gpu=gpu,
        tier=tier,
        strict=strict,
        hugetlb=hugetlb,
        cuda_register=bool(register),
        long_term_pin=bool(long_term_pin),
        label=label,
        name=name,
        acl_uids=acl_uids,
        acl_gids=acl_gids,
    )
    _ensure_registered(lease, device, bool(register))
    return _tensor_over(lease, nbytes, dtype, dims)


def zeros(*shape: Any, dtype: _torch.dtype | None = None, **kwargs: Any) -> _torch.Tensor:
    """Like empty(), filled with zeros."""
    return empty(*shape, dtype=dtype, **kwargs).zero_()


def ones(*shape: Any, dtype: _torch.dtype | None = None, **kwargs: Any) -> _torch.Tensor:
    """Like empty(), filled with ones."""
    return empty(*shape, dtype=dtype, **kwargs).fill_(1)


def full(shape: Sequence[int], fill_value: Any, dtype: _torch.dtype | None = None, **kwargs: Any) -> _torch.Tensor:
    """Like empty(), filled with fill_value."""
    return empty(tuple(shape), dtype=dtype, **kwargs).fill_(fill_value)


def empty_like(t: _torch.Tensor, dtype: _torch.dtype | None = None, **kwargs: Any) -> _torch.Tensor:
    """A lease-backed tensor of t's shape (and dtype unless given)."""
    return empty(tuple(t.shape), dtype=dtype or t.dtype, **kwargs)


def zeros_like(t: _torch.Tensor, dtype: _torch.dtype | None = None, **kwargs: Any) -> _torch.Tensor:
    """empty_like(), filled with zeros."""
    return empty_like(t, dtype=dtype, **kwargs).zero_()


def pin(t: _torch.Tensor, **kwargs: Any) -> _torch.Tensor:
    """A copy of t (on any device) in a lease: the pool's pin_memory()."""
    out = empty_like(t, **kwargs)
    out.copy_(t)
    return out


def attach(
    name: str,
    shape: Sequence[int] | None = None,
    dtype: _torch.dtype = _torch.uint8,
    near_gpu: Any = None,
    register: bool | None = None,
    client: Client | None = None,
    owner_uid: int | None = None,
) -> _torch.Tensor:
    """A tensor over the shared named lease ``name`` made by another process.

    owner_uid: the uid that made it (names live in one namespace per owner;
    None: this process's own uid). shape None: the whole requested size as a
    1-D tensor of dtype. Raises NotFoundError (no such name, or not in its
    ACL), InvalidArgumentError (shape larger than the lease).
    """
    cl = client or get_client()
    lease = cl.attach(name, owner_uid)
    itemsize = _torch.empty((), dtype=dtype).element_size()
    if shape is None:
        dims: tuple[int, ...] = (lease.requested_size // itemsize,)
    else:
        dims = _shape((tuple(shape),))
    nbytes = math.prod(dims) * itemsize
    if nbytes > lease.size:
        lease.release()
        raise _from_code(
            ErrorCode.INVALID_ARGUMENT,
            f"shape {dims} of {dtype} needs {nbytes} bytes; lease '{name}' has {lease.size}",
        )
    device = _device_index(near_gpu)
    if register is None:
        register = device >= 0
    if register:
        lease.cuda_register(max(device, 0))
    return _tensor_over(lease, nbytes, dtype, dims)


def lease_of(t: _torch.Tensor) -> Lease | None:
    """The Lease behind a tensor made here (any view of it), else None."""
    return _leases.get(_storage_ptr(t))


# ---- PyTorch's pinned-memory allocator ----


def use_as_pinned_allocator(
    small_max: int = 1 << 20,
    slab_bytes: int = 2 << 20,
    socket: str | None = None,
    priority: int = 100,
) -> None:
    """Serves PyTorch's CUDA host allocator from the pool (PyTorch >= 2.8).

    From then on pin_memory(), torch.empty(..., pin_memory=True) and the
    DataLoader's pin thread get exact-size leases near the current device
    (registered there); requests below ``small_max`` bytes are carved from
    ``slab_bytes`` slab leases; freed memory goes back to the pool (a slab
    once it is empty). Raises UnsupportedError when this PyTorch has no host
    allocator hook or the extension was not built (docs/python.md), and the
    daemon's error when it cannot be reached.
    """
    lib = _torch_ext.load()
    err = ctypes.create_string_buffer(512)
    rc = lib.cxlpool_torch_install(
        socket.encode() if socket else None,
        ctypes.c_uint64(small_max),
        ctypes.c_uint64(slab_bytes),
        ctypes.c_int(priority),
        err,
        ctypes.c_size_t(len(err)),
    )
    if rc != 0:
        raise _from_code(-rc, err.value.decode(errors="replace"))


def pinned_allocator_installed() -> bool:
    """True once use_as_pinned_allocator() succeeded in this process."""
    lib = _torch_ext.loaded()
    return bool(lib is not None and lib.cxlpool_torch_installed())


def pinned_allocator_stats() -> dict[str, int]:
    """The allocator's counters: requested_bytes, leased_bytes, large_leases,
    slabs, small_blocks, allocations, failures, deferred_frees."""
    lib = _torch_ext.loaded()
    if lib is None:
        raise UnsupportedError(int(ErrorCode.UNSUPPORTED), "the pinned allocator is not installed")
    keys = _torch_ext.STAT_KEYS
    out = (ctypes.c_uint64 * len(keys))()
    n = lib.cxlpool_torch_stats(out, len(keys))
    return {k: int(out[i]) for i, k in enumerate(keys[:n])}
