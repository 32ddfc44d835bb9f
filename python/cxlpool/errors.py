"""Exceptions raised by cxlpool: one class per error code of the daemon and
the client library, all subclasses of :class:`Error`.

Every exception carries ``code`` (an :class:`ErrorCode`), ``message`` (the
daemon's or the library's detail, e.g. ``"quota uid 1000 dram: 8 GiB used of
8 GiB"``) and ``c_error`` (the C ABI's negative ``CXLPOOL_E*`` value).
"""

from __future__ import annotations

import enum

__all__ = [
    "ErrorCode",
    "Error",
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


class ErrorCode(enum.IntEnum):
    """The codes of ``cxlpool.h`` (``CXLPOOL_E*``), positive."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    PERMISSION_DENIED = 3
    RESOURCE_EXHAUSTED = 4
    UNAVAILABLE = 5
    UNSUPPORTED = 6
    PROTOCOL = 7
    IO = 8
    INTERNAL = 9
    ALREADY_EXISTS = 10
    REVOKED = 11


class Error(Exception):
    """A failed cxlpool call: ``code``, ``message`` and ``c_error``."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, code: int, message: str) -> None:
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = ErrorCode.INTERNAL
        self.message = message
        super().__init__(f"{_TEXT.get(self.code, 'unknown error')}: {message}")

    @property
    def c_error(self) -> int:
        """The C ABI's code: ``-code``."""
        return -int(self.code)

    def __reduce__(self):  # picklable across processes
        return (_from_code, (int(self.code), self.message))


class InvalidArgumentError(Error, ValueError):
    """Bad size, unknown option, a released lease."""


class NotFoundError(Error, LookupError):
    """No such lease, name, node, GPU, or no daemon socket."""


class PermissionDeniedError(Error, PermissionError):
    """Not in the shared lease's ACL, not admin, EACCES on the socket."""


class ResourceExhaustedError(Error):
    """Pool full or quota reached (``message`` names the limit)."""


class UnavailableError(Error, ConnectionError):
    """The daemon is unreachable or went away; no GPU."""


class UnsupportedError(Error):
    """No CUDA driver, a missing entry point, an option the daemon lacks."""


class ProtocolError(Error):
    """A garbled reply or no common protocol version."""


class IoError(Error):
    """A system call failed (mmap, the CUDA driver refused)."""


class InternalError(Error):
    """A broken invariant in the library or the daemon."""


class AlreadyExistsError(Error):
    """The shared name is taken; already registered with CUDA."""


class RevokedError(Error):
    """An administrator revoked the lease."""


_TEXT = {
    ErrorCode.INVALID_ARGUMENT: "invalid argument",
    ErrorCode.NOT_FOUND: "not found",
    ErrorCode.PERMISSION_DENIED: "permission denied",
    ErrorCode.RESOURCE_EXHAUSTED: "resource exhausted",
    ErrorCode.UNAVAILABLE: "unavailable",
    ErrorCode.UNSUPPORTED: "unsupported",
    ErrorCode.PROTOCOL: "protocol error",
    ErrorCode.IO: "i/o error",
    ErrorCode.INTERNAL: "internal error",
    ErrorCode.ALREADY_EXISTS: "already exists",
    ErrorCode.REVOKED: "revoked",
}

_CLASSES = {
    ErrorCode.INVALID_ARGUMENT: InvalidArgumentError,
    ErrorCode.NOT_FOUND: NotFoundError,
    ErrorCode.PERMISSION_DENIED: PermissionDeniedError,
    ErrorCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    ErrorCode.UNAVAILABLE: UnavailableError,
    ErrorCode.UNSUPPORTED: UnsupportedError,
    ErrorCode.PROTOCOL: ProtocolError,
    ErrorCode.IO: IoError,
    ErrorCode.INTERNAL: InternalError,
    ErrorCode.ALREADY_EXISTS: AlreadyExistsError,
    ErrorCode.REVOKED: RevokedError,
}


def _from_code(code: int, message: str) -> Error:
    """The exception for a code (the binding raises what this returns)."""
    try:
        cls = _CLASSES.get(ErrorCode(code), InternalError)
    except ValueError:
        cls = InternalError
    return cls(code, message)
