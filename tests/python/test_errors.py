"""Errors carry the daemon's code and message, as cxlpool.Error subclasses."""

from __future__ import annotations

import os
import pickle

import pytest

import cxlpool

MiB = 1 << 20


def test_no_daemon_is_unavailable_or_not_found(tmp_path):
    with pytest.raises(cxlpool.Error) as e:
        cxlpool.Client(str(tmp_path / "absent.sock"))
    assert isinstance(e.value, (cxlpool.NotFoundError, cxlpool.UnavailableError))
    assert e.value.code in (cxlpool.ErrorCode.NOT_FOUND, cxlpool.ErrorCode.UNAVAILABLE)
    assert e.value.c_error == -int(e.value.code)
    assert "absent.sock" in e.value.message or e.value.message


def test_default_socket_path_follows_the_environment(monkeypatch):
    monkeypatch.setenv("CXLPOOL_SOCKET", "/tmp/some.sock")
    assert cxlpool.default_socket_path() == "/tmp/some.sock"
    assert cxlpool.__version__ == cxlpool.library_version()


def test_bad_arguments(daemon):
    c = cxlpool.Client()
    with pytest.raises(cxlpool.InvalidArgumentError, match="size must be > 0"):
        c.allocate(0)
    with pytest.raises(cxlpool.InvalidArgumentError):
        c.allocate(-5)
    with pytest.raises(cxlpool.InvalidArgumentError, match="64 bits"):
        c.allocate(1 << 70)
    with pytest.raises(cxlpool.InvalidArgumentError, match="ACL needs a shared lease name"):
        c.allocate(MiB, acl_uids=[1000])
    with pytest.raises(cxlpool.InvalidArgumentError):
        c.allocate(MiB, name="")
    with pytest.raises(cxlpool.InvalidArgumentError):
        c.allocate(MiB, tier=[1, 2])
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        c.allocate(MiB, near_gpu=-7)
    assert daemon.leases() == []


def test_daemon_refusals(make_daemon):
    d = make_daemon(f"""
[[quota]]
uid = {os.getuid()}
max_bytes = "4M"
""")
    c = cxlpool.Client()
    held = c.allocate(3 * MiB)
    with pytest.raises(cxlpool.ResourceExhaustedError) as e:
        c.allocate(2 * MiB)
    assert e.value.code == cxlpool.ErrorCode.RESOURCE_EXHAUSTED
    assert "quota" in e.value.message
    assert str(e.value).startswith("resource exhausted: ")
    with pytest.raises(cxlpool.NotFoundError) as nf:
        c.attach("no-such-lease")
    assert isinstance(nf.value, LookupError)
    shared = c.allocate(4096, name="taken")
    with pytest.raises(cxlpool.AlreadyExistsError):
        c.allocate(4096, name="taken")
    shared.release()
    held.release()
    with pytest.raises(cxlpool.InvalidArgumentError, match="released"):
        held.release()
    with pytest.raises(cxlpool.InvalidArgumentError, match="released"):
        held.cuda_register(0)
    with pytest.raises(BufferError):
        memoryview(held)
    assert d.wait_leases(0) == []


def test_cuda_errors_without_a_driver(daemon, monkeypatch):
    monkeypatch.setenv("CXLPOOL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
    c = cxlpool.Client()
    lease = c.allocate(MiB)
    with pytest.raises(cxlpool.NotFoundError):
        lease.device_ptr  # never registered
    assert lease.device_chunks == []
    assert lease.extents == [(0, MiB, 4096)]  # one file: one extent
    # Registration failure does not fail the allocation; device_ptr says why.
    reg = c.allocate(MiB, cuda_register=True)
    with pytest.raises(cxlpool.Error) as e:
        reg.device_ptr
    assert e.value.code in (cxlpool.ErrorCode.UNSUPPORTED, cxlpool.ErrorCode.UNAVAILABLE)


def test_errors_pickle_with_code_and_message():
    e = cxlpool.errors._from_code(4, "quota uid 1 dram: full")
    assert isinstance(e, cxlpool.ResourceExhaustedError)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cxlpool.ResourceExhaustedError
    assert back.code == cxlpool.ErrorCode.RESOURCE_EXHAUSTED and back.message == e.message
    assert isinstance(cxlpool.errors._from_code(99, "x"), cxlpool.InternalError)
