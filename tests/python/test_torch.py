"""cxlpool.torch against a real daemon with Debian's PyTorch: tensors in
leases, their lifetimes (a lease goes when the last view of its storage
goes, a SIGKILLed process gives everything back), named leases across two
interpreters, map-don't-register, and the allocator hook's clear refusal on
a PyTorch without it."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import cxlpool  # noqa: E402
import cxlpool.torch as ct  # noqa: E402

from conftest import run_python  # noqa: E402

MiB = 1 << 20


@pytest.fixture(autouse=True)
def fresh_client():
    ct.set_client(None)
    yield
    ct.set_client(None)
    gc.collect()


def storage_nbytes(t) -> int:
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().nbytes()
    s = t.storage()
    return s.size() * s.element_size()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.bool, torch.complex64])
def test_empty_has_the_shape_dtype_and_exact_storage(daemon, dtype):
    t = ct.empty((3, 5, 7), dtype=dtype)
    assert t.shape == (3, 5, 7) and t.dtype == dtype and t.device.type == "cpu"
    assert t.is_contiguous()
    assert storage_nbytes(t) == t.numel() * t.element_size()
    lease = ct.lease_of(t)
    assert lease is not None and lease.requested_size == t.numel() * t.element_size()
    assert t.data_ptr() == lease.ptr
    [info] = daemon.leases()
    assert info["label"] == "torch" and info["requested_bytes"] == lease.requested_size


def test_fillers_and_likes(daemon):
    z = ct.zeros(4, 4)
    assert z.dtype == torch.get_default_dtype() and z.sum().item() == 0
    assert ct.ones(3, dtype=torch.int32).tolist() == [1, 1, 1]
    assert ct.full((2, 2), 7.5).tolist() == [[7.5, 7.5], [7.5, 7.5]]
    src = torch.arange(12, dtype=torch.float64).view(3, 4)
    like = ct.empty_like(src)
    assert like.shape == src.shape and like.dtype == torch.float64
    assert ct.zeros_like(src).abs().sum().item() == 0
    pinned = ct.pin(src)
    assert torch.equal(pinned, src) and ct.lease_of(pinned) is not None
    assert ct.empty(0, dtype=torch.float32).numel() == 0
    with pytest.raises(cxlpool.InvalidArgumentError):
        ct.empty(-1)


def test_tensor_memory_is_the_lease(daemon):
    t = ct.zeros(1024, dtype=torch.int32)
    t[10] = 12345
    lease = ct.lease_of(t)
    import numpy as np
    assert np.frombuffer(lease, dtype=np.int32, count=11)[10] == 12345


def test_lease_released_when_the_last_view_dies(daemon):
    t = ct.empty((1024, 256), dtype=torch.float32)
    lease_id = ct.lease_of(t).id
    views = [t[3], t.view(-1)[100:200], t.t(), t.view(torch.int32)]
    del t
    gc.collect()
    assert [l["id"] for l in daemon.leases()] == [lease_id], "views keep the storage"
    views.pop()
    views.pop()
    gc.collect()
    assert len(daemon.leases()) == 1
    del views
    gc.collect()
    assert daemon.wait_leases(0) == []


def test_many_tensors_come_and_go(daemon):
    ts = [ct.empty(MiB // 4 + i, dtype=torch.uint8) for i in range(20)]
    assert len(daemon.leases()) == 20
    del ts[::2]
    gc.collect()
    assert len(daemon.wait_leases(10)) == 10
    ts.clear()
    gc.collect()
    assert daemon.wait_leases(0) == []


def test_no_gpu_means_not_registered_and_map_dont_register(daemon):
    assert not torch.cuda.is_available()
    t = ct.empty(MiB, dtype=torch.uint8)
    assert ct.lease_of(t).device_chunks == []
    assert not t.is_pinned()
    u = ct.empty(MiB, dtype=torch.uint8, register=False)
    assert ct.lease_of(u).device_chunks == []


def test_explicit_register_without_a_driver_fails_and_leaks_nothing(daemon, monkeypatch):
    monkeypatch.setenv("CXLPOOL_CUDA_LIBRARY", "/nonexistent/libcuda.so.1")
    with pytest.raises(cxlpool.Error):
        ct.empty(MiB, dtype=torch.uint8, register=True, near_gpu=None)
    gc.collect()
    assert daemon.wait_leases(0) == []


def test_placement_options(daemon):
    t = ct.empty(MiB, dtype=torch.uint8, tier="dram", numa_node=0, strict=True, label="kv")
    info = ct.lease_of(t).info
    assert info.numa_node == 0 and info.kind == "dram" and info.label == "kv"
    with pytest.raises(cxlpool.InvalidArgumentError):
        ct.empty(4, near_gpu="cpu")


def test_named_lease_across_two_interpreters(daemon):
    # The child makes a named tensor, fills it, and waits; we attach, read,
    # write back; the child sees our write.
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, torch, cxlpool.torch as ct
            t = ct.empty((64, 128), dtype=torch.float32, name="py-kv", label="owner")
            t.copy_(torch.arange(64 * 128, dtype=torch.float32).view(64, 128))
            print("ready", flush=True)
            sys.stdin.readline()
            print("seen", float(t[0, 0]), flush=True)
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert child.stdout.readline().strip() == "ready"
        t = ct.attach("py-kv", (64, 128), torch.float32)
        assert t[63, 127].item() == 64 * 128 - 1
        assert ct.lease_of(t).name == "py-kv"
        [info] = daemon.leases()
        assert info["holders"] == 2 and info["shared_name"] == "py-kv"
        t[0, 0] = -1.0
        out, _ = child.communicate("go\n", timeout=30)
        assert "seen -1.0" in out
        assert child.returncode == 0
        # The child's exit leaves our mapping alive.
        assert t[1, 0].item() == 128
        whole = ct.attach("py-kv")  # shape None: the whole requested size
        assert whole.numel() == 64 * 128 * 4
        with pytest.raises(cxlpool.InvalidArgumentError, match="needs"):
            ct.attach("py-kv", (1024, 1024), torch.float32)
        del t, whole
        gc.collect()
        assert daemon.wait_leases(0) == []
    finally:
        child.kill()
        child.wait()


def test_sigkilled_python_process_gives_everything_back(daemon):
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time, torch, cxlpool.torch as ct
            keep = [ct.zeros(2 << 20, dtype=torch.uint8) for _ in range(3)]
            keep.append(ct.empty(4096, dtype=torch.uint8, name="dies-with-me"))
            print("ready", flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert child.stdout.readline().strip() == "ready"
        assert len(daemon.leases()) == 4
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert daemon.wait_leases(0) == []
        with pytest.raises(cxlpool.NotFoundError):
            cxlpool.Client().attach("dies-with-me")
    finally:
        child.kill()
        child.wait()


def test_pinned_allocator_hook_needs_torch_2_8(daemon):
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) >= (2, 8):
        pytest.skip("this PyTorch has the hook; the GPU check exercises it")
    with pytest.raises(cxlpool.UnsupportedError, match="2.8 or later"):
        ct.use_as_pinned_allocator()
    assert not ct.pinned_allocator_installed()
    with pytest.raises(cxlpool.UnsupportedError):
        ct.pinned_allocator_stats()


def test_no_daemon_raises_from_torch_helpers(tmp_path, monkeypatch):
    monkeypatch.setenv("CXLPOOL_SOCKET", str(tmp_path / "none.sock"))
    r = run_python("import torch, cxlpool, cxlpool.torch as ct\n"
                   "try:\n    ct.empty(10)\nexcept cxlpool.Error as e:\n"
                   "    print(type(e).__name__, int(e.code))\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] in ("NotFoundError", "UnavailableError")


def test_pinned_allocator_says_how_to_build_the_missing_extension(daemon, monkeypatch, tmp_path):
    # As on a PyTorch >= 2.8 where the extension was not built.
    from cxlpool import _torch_ext

    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    monkeypatch.setenv("CXLPOOL_TORCH_EXT", str(tmp_path / "_torch_host_allocator.so"))
    assert _torch_ext.path() == str(tmp_path / "_torch_host_allocator.so")
    with pytest.raises(cxlpool.UnsupportedError, match="not built.*build-python-ext.sh"):
        ct.use_as_pinned_allocator()
    assert _torch_ext.loaded() is None
