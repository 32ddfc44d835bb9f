"""examples/kv_offload.py: process A stores a prefix's KV blocks in a named
lease, process B restores them and decodes; B's logits must equal a
from-scratch recompute (quick mode: a tiny model, short prefixes). The bench
path runs too, with no timing asserted (speed goals are not unit tests)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

EXAMPLE = os.path.join(os.environ.get("CXLPOOL_SOURCE_DIR", "."), "examples", "kv_offload.py")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, EXAMPLE, "--quick", "--device", "cpu", *args],
                          capture_output=True, text=True, timeout=240, env=dict(os.environ))


def test_restored_prefix_decodes_like_recompute(daemon):
    r = run("--name", "kv-offload-test")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "A: stored 4 blocks (64 tokens" in r.stdout, r.stdout
    assert "B: attached 'kv-offload-test'" in r.stdout
    for n in (32, 64):
        assert f"prefix {n:5d} tokens: {n // 16} blocks restored, 8 tokens decoded, logits match" in r.stdout
    assert "all 2 prefix lengths match recompute" in r.stdout
    assert daemon.wait_leases(0) == []


def test_a_damaged_block_is_caught(daemon):
    """The check can fail: restoring blocks computed with another seed differs."""
    store = subprocess.Popen([sys.executable, EXAMPLE, "--quick", "--device", "cpu", "--role", "store",
                              "--name", "kv-offload-other", "--seed", "99"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert store.stdout.readline().startswith("A: stored")
        r = run("--role", "restore", "--name", "kv-offload-other")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "logits DIFFER recompute" in r.stdout
    finally:
        store.stdin.close()
        store.wait(timeout=60)
        store.stdout.close()
    assert daemon.wait_leases(0) == []


def test_bench_prints_a_ratio_per_length(daemon):
    r = run("--bench", "--name", "kv-offload-bench")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "restore from the lease vs recompute on cpu (median of 3 runs" in r.stdout
    assert sum(1 for line in r.stdout.splitlines() if line.rstrip().endswith("x")) == 2
