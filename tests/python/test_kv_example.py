"""examples/kv_cache_pool.py: scheduler and worker processes share a KV
block pool in one named lease (CPU path here; the GPU check runs it with a
GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

EXAMPLE = os.path.join(os.environ.get("CXLPOOL_SOURCE_DIR", "."), "examples", "kv_cache_pool.py")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_scheduler_and_worker_agree_on_every_block(daemon, dtype):
    r = subprocess.run([sys.executable, EXAMPLE, "--blocks", "48", "--sequences", "6", "--dtype", dtype,
                        "--name", f"kv-test-{dtype}"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "worker: attached 'kv-test-" in r.stdout
    assert "24/24 worker blocks verified (CPU path" in r.stdout, r.stdout
    assert daemon.wait_leases(0) == []


def test_worker_refuses_a_lease_that_is_not_a_pool(daemon):
    import cxlpool

    keep = cxlpool.Client().allocate(1 << 20, name="not-a-pool")
    r = subprocess.run([sys.executable, EXAMPLE, "--role", "worker", "--name", "not-a-pool"],
                       input="[]\n", capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode != 0
    assert "bad magic" in r.stdout + r.stderr
    keep.release()
