"""cxlpool.Client and cxlpool.Lease against a real daemon: the buffer
protocol, DLPack, context managers, every placement option, shared leases."""

from __future__ import annotations

import ctypes
import gc
import os
import time

import pytest

import cxlpool

np = pytest.importorskip("numpy")

MiB = 1 << 20


def capsule_name(cap) -> str:
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    return get(cap).decode()


def test_memoryview_writes_reach_the_mapping(daemon):
    with cxlpool.Client() as c:
        lease = c.allocate(MiB + 5, label="py-test")
        assert lease.size >= MiB + 5 and lease.size % 4096 == 0
        assert lease.requested_size == MiB + 5
        mv = memoryview(lease)
        assert mv.nbytes == lease.size and not mv.readonly and mv.format == "B"
        mv[:5] = b"hello"
        assert ctypes.string_at(lease.ptr, 5) == b"hello"
        assert lease.exports == 1
        mv.release()
        assert lease.exports == 0
        [info] = daemon.leases()
        assert info["id"] == lease.id and info["label"] == "py-test"
        assert info["requested_bytes"] == MiB + 5
        lease.release()
        assert lease.released and lease.ptr == 0 and len(lease) == 0
        assert daemon.wait_leases(0) == []


def test_numpy_views_share_memory_and_keep_the_lease(daemon):
    c = cxlpool.Client()
    lease = c.allocate(8 * MiB)
    a = np.frombuffer(lease, dtype=np.float32)
    a[:] = 1.5
    b = np.frombuffer(lease, dtype=np.float32, count=4, offset=4)
    assert b.tolist() == [1.5] * 4
    assert lease.exports == 2
    with pytest.raises(BufferError, match="2 live exports"):
        lease.release()
    del a, b
    gc.collect()
    assert lease.exports == 0
    lease.release()


def test_dlpack_numpy_and_versioned_capsules(daemon):
    c = cxlpool.Client()
    lease = c.allocate(2 * MiB)
    assert lease.__dlpack_device__() == (1, 0)
    memoryview(lease)[:3] = b"abc"
    arr = np.from_dlpack(lease)
    assert arr.dtype == np.uint8 and arr.shape == (lease.size,)
    assert bytes(arr[:3]) == b"abc"
    assert lease.exports == 1
    # A DLPack >= 1.0 consumer gets a versioned capsule; an unconsumed one
    # gives its export back when it is collected.
    cap = lease.__dlpack__(max_version=(1, 0))
    assert capsule_name(cap) == "dltensor_versioned"
    assert capsule_name(lease.__dlpack__()) == "dltensor"
    assert lease.exports == 2
    del cap
    gc.collect()
    assert lease.exports == 1
    with pytest.raises(BufferError):
        lease.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        lease.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        lease.__dlpack__(stream=7)
    del arr
    gc.collect()
    assert lease.exports == 0


def test_window_bounds(daemon):
    lease = cxlpool.Client().allocate(MiB)
    w = lease.window(4096, 100)
    assert (w.offset, w.nbytes) == (4096, 100)
    assert np.from_dlpack(w).shape == (100,)
    with pytest.raises(cxlpool.InvalidArgumentError, match="outside the lease"):
        lease.window(lease.size, 1)
    gc.collect()


def test_with_block_defers_release_until_the_last_export(daemon):
    c = cxlpool.Client()
    with c.allocate(MiB) as lease:
        view = np.frombuffer(lease, dtype=np.uint8)
    assert not lease.released and lease.release_pending
    assert len(daemon.leases()) == 1
    view[0] = 7  # still mapped
    del view
    gc.collect()
    assert lease.released
    assert daemon.wait_leases(0) == []


def test_garbage_collected_lease_is_released(daemon):
    c = cxlpool.Client()
    c.allocate(MiB)  # dropped at once
    gc.collect()
    assert daemon.wait_leases(0) == []


def test_placement_options_reach_the_daemon(daemon):
    c = cxlpool.Client()
    lease = c.allocate(MiB, numa_node=0, tier=["dram"], strict=True, label="placed")
    assert lease.numa_node == 0
    info = lease.info
    assert info.numa_node == 0 and info.kind == "dram" and info.pool
    assert info.requested_bytes == MiB and info.label == "placed"
    assert "LeaseInfo(" in repr(info) and "node=0" in repr(lease)
    lease.release()
    # A comma-separated tier string is the same as a list.
    lease2 = c.allocate(MiB, tier="dram,cxl")
    assert lease2.info.kind == "dram"
    lease2.release()
    # Strict placement on a node that does not exist is refused.
    with pytest.raises(cxlpool.Error) as e:
        c.allocate(MiB, numa_node=63, strict=True)
    assert e.value.code in (cxlpool.ErrorCode.NOT_FOUND, cxlpool.ErrorCode.INVALID_ARGUMENT,
                            cxlpool.ErrorCode.RESOURCE_EXHAUSTED)
    assert e.value.message


def test_shared_lease_attach_in_one_process(daemon):
    c1, c2 = cxlpool.Client(), cxlpool.Client()
    owner = c1.allocate(MiB, name="py-shared")
    assert owner.name == "py-shared"
    memoryview(owner)[:4] = b"kv01"
    other = c2.attach("py-shared")
    assert other.id == owner.id and other.name == "py-shared"
    assert other.info.owner_uid == os.getuid()  # the attach says whose lease it is
    assert bytes(memoryview(other)[:4]) == b"kv01"
    # Names live in their owner's namespace: named by owner, or not found.
    named = c2.attach("py-shared", owner_uid=os.getuid())
    assert named.id == owner.id
    named.release()
    with pytest.raises(cxlpool.NotFoundError):
        c2.attach("py-shared", owner_uid=os.getuid() + 1)
    [info] = daemon.leases()
    assert info["shared_name"] == "py-shared" and info["holders"] == 2
    other.release()
    owner.release()
    assert daemon.wait_leases(0) == []


def test_client_close_keeps_leases(daemon):
    c = cxlpool.Client()
    assert c.connected and c.protocol_version >= 1 and c.server_version
    assert c.socket == daemon.socket
    lease = c.allocate(MiB)
    c.close()
    assert not c.connected
    memoryview(lease)[0] = 1  # still mapped
    with pytest.raises(cxlpool.UnavailableError):
        c.allocate(MiB)
    lease.release()
    assert daemon.wait_leases(0) == []


def test_process_events_and_revocation(daemon):
    c = cxlpool.Client()
    lease = c.allocate(MiB)
    assert c.process_events() == 0
    r = daemon.ctl("revoke", str(lease.id))
    assert r.returncode == 0, r.stderr
    for _ in range(500):  # bounded poll
        c.process_events()
        if lease.revoked:
            break
        time.sleep(0.01)
    assert lease.revoked
    lease.release()  # REVOKED is not an error for release()


def pages_nodes(ptr: int, size: int, step: int = 1 << 20) -> set[int]:
    """The NUMA node of one page per `step` bytes, asked of the kernel
    (move_pages with no target nodes only reports)."""
    libnuma = ctypes.CDLL("libnuma.so.1", use_errno=True)
    n = max(1, size // step)
    pages = (ctypes.c_void_p * n)(*[ptr + i * step for i in range(n)])
    status = (ctypes.c_int * n)()
    libnuma.numa_move_pages.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    rc = libnuma.numa_move_pages(0, n, pages, None, status, 0)
    assert rc == 0, os.strerror(ctypes.get_errno())
    return set(status)


def test_pages_are_where_the_daemon_says(daemon):
    lease = cxlpool.Client().allocate(16 * MiB, numa_node=0, strict=True)
    memoryview(lease)[::4096] = b"\1" * (lease.size // 4096)
    assert pages_nodes(lease.ptr, lease.size) == {lease.numa_node} == {0}
    lease.release()


def test_long_term_pin_and_verify(daemon):
    lease = cxlpool.Client().allocate(4 * MiB, numa_node=0, long_term_pin=True)
    assert lease.info.long_term_pin and lease.info.placed_numa_node == -1
    [info] = daemon.leases()
    assert info["long_term_pin"] is True
    memoryview(lease)[::4096] = b"\1" * (lease.size // 4096)
    p = lease.verify()
    assert isinstance(p, cxlpool.Placement)
    assert p.numa_node == 0 and not p.moved and p.pages_absent == 0
    assert p.pages_sampled == p.pages_on_node > 0
    assert lease.info.moved_reason == ""
    lease.release()
    with pytest.raises(cxlpool.InvalidArgumentError, match="released"):
        lease.verify()
