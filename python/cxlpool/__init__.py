"""cxlpool: leases of pooled host and CXL memory from the node's cxlpoold.

    import cxlpool
    with cxlpool.Client() as client:              # $CXLPOOL_SOCKET or the default socket
        with client.allocate(1 << 30, near_gpu=0) as lease:
            buf = memoryview(lease)              # or numpy.frombuffer(lease, dtype=...)
            buf[:5] = b"hello"

Shared named leases: ``client.allocate(size, name="kv", acl_uids=[1001])`` in
one process, ``client.attach("kv")`` in another maps the same memory.

``cxlpool.torch`` makes PyTorch tensors backed by leases and can serve
PyTorch's pinned-memory allocator from the pool (docs/python.md).
"""

from __future__ import annotations

from ._cxlpool import Client, Lease, LeaseInfo, LeaseWindow, Placement, default_socket_path
from ._cxlpool import version as _library_version
from .errors import (
    AlreadyExistsError,
    Error,
    ErrorCode,
    InternalError,
    InvalidArgumentError,
    IoError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    ResourceExhaustedError,
    RevokedError,
    UnavailableError,
    UnsupportedError,
)

__version__: str = _library_version()

__all__ = [
    "Client",
    "Lease",
    "LeaseInfo",
    "LeaseWindow",
    "Placement",
    "connect",
    "default_socket_path",
    "library_version",
    "Error",
    "ErrorCode",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnavailableError",
    "UnsupportedError",
    "ProtocolError",
    "IoError",
    "InternalError",
    "AlreadyExistsError",
    "RevokedError",
]


def connect(socket: str | None = None) -> Client:
    """Connects to cxlpoold: the same as ``Client(socket)``."""
    return Client(socket)


def library_version() -> str:
    """The version of libcxlpool this package is linked against."""
    return _library_version()
