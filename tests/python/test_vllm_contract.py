"""cxlpool.vllm against the shape of vLLM 0.26.0's KV offload API (vLLM cannot
be installed here; vllm_standin.py puts its interface at vLLM's module paths
and loads the spec as vLLM's factory does).

A scheduler process and two TP worker processes run the connector's store
and load paths over CPU tensors on one named lease; every process is then
SIGKILLed and nothing is left: no lease, no file, the pool's accounting back
at its baseline. vLLM's own approach, a named file in /dev/shm, is shown to
stay behind in the same scenario.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

torch = pytest.importorskip("torch")

import cxlpool  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_standin as vs  # noqa: E402

vs.install()
import cxlpool.vllm as cv  # noqa: E402

ROLES = os.path.join(HERE, "vllm_contract_roles.py")


class Role:
    """One process of the engine, spoken to a JSON line at a time."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, ROLES, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ))
        self.hello = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"{self.proc.args[2:]} exited: {self.proc.stderr.read()}")
        return json.loads(line)

    def __call__(self, op: str, **kw) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def accounting(daemon) -> list[tuple]:
    return [(p["name"], p["leased_bytes"], p["lease_count"], p["reclaiming_bytes"])
            for p in daemon.ctl_json("pools")]


def poll(fn, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def shm_files(engine_id: str) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if engine_id in f]


def test_store_load_then_sigkill_leaves_nothing(daemon):
    engine = f"contract-{uuid.uuid4().hex[:12]}"
    baseline = accounting(daemon)
    roles = []
    try:
        sched = Role("scheduler", engine)
        roles.append(sched)
        assert sched.hello["num_blocks"] == vs.NUM_CPU_BLOCKS and sched.hello["created"]
        workers = [Role("worker", engine, str(r)) for r in range(vs.WORLD_SIZE)]
        roles += workers
        assert {w.hello["lease"] for w in workers} == {sched.hello["lease"]}
        assert workers[0].hello["handlers"] == ["CPU->GPU", "GPU->CPU"]

        (lease,) = daemon.leases()
        assert lease["shared_name"] == f"vllm-kv-{engine}" and lease["holders"] == 3
        assert lease["requested_bytes"] == vs.REGION_BYTES == 129024  # exact, not 2^n

        # Store path: lookup misses, prepare_store, each worker's GPU->CPU
        # transfer of GPU blocks 0..7 (4 offloaded blocks), complete_store.
        hashes = [f"h{i}" for i in range(4)]
        assert sched("lookup", hashes=hashes)["hits"] == 0
        store = sched("prepare_store", hashes=hashes)
        assert store["store"] == hashes and store["medium"] == "CPU" and store["evicted"] == []
        for w in workers:
            r = w("store", job=1, gpu=list(range(8)), cpu=store["ids"])
            assert r["done"] == 1 and r["success"]
            assert r["bytes"] == 8 * vs.LAYERS * vs.PAGE_BYTES
        assert sched("lookup", hashes=hashes)["hits"] == 0  # not loadable before complete_store
        sched("complete_store", hashes=hashes)
        assert sched("lookup", hashes=hashes)["hits"] == 4
        assert sched("check_cells", ids=store["ids"], first_gpu_block=0)["match"]

        # Load path: blocks h1, h2 into GPU blocks 8..10, starting one GPU
        # block into h1 (block_indices: token block 3 of the request).
        load = sched("prepare_load", hashes=hashes[1:3])
        sched("touch", hashes=hashes)
        assert load["ids"] == store["ids"][1:3]
        for w in workers:
            r = w("load", job=2, cpu=load["ids"], gpu=[8, 9, 10], first_index=3, expect=[3, 4, 5])
            assert r["done"] == 2 and r["success"] and r["match"], r
        # A block being loaded is not evicted: 4 new blocks need 1 of the
        # stored ones, and only h0 or h3 may go.
        more = sched("prepare_store", hashes=[f"n{i}" for i in range(4)])
        assert len(more["evicted"]) == 1 and more["evicted"][0] in ("h0", "h3")
        sched("complete_load", hashes=hashes[1:3])
        sched("complete_store", hashes=more["store"])
    finally:
        for r in roles:
            r.kill()
    assert daemon.wait_leases(0) == []
    assert poll(lambda: accounting(daemon) == baseline), (accounting(daemon), baseline)
    assert shm_files(engine) == []
    with pytest.raises(cxlpool.NotFoundError):
        cxlpool.Client().attach(f"vllm-kv-{engine}")


def test_vllm_shm_file_outlives_a_sigkilled_engine():
    """The same scenario with vLLM's approach (a plain file, not vLLM's code)."""
    engine = f"contract-{uuid.uuid4().hex[:12]}"
    role = Role("shm", engine)
    path = role.hello["path"]
    try:
        role.kill()
        assert os.path.exists(path) and os.path.getsize(path) == vs.REGION_BYTES
        assert shm_files(engine) == [os.path.basename(path)]
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_without_a_daemon_it_fails_at_start_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("CXLPOOL_SOCKET", str(tmp_path / "none.sock"))
    with pytest.raises(cv.OffloadConfigError, match=r"start cxlpoold .* or set .*cxlpool_socket"):
        vs.create_spec(*vs.make_config("nodaemon"))


def test_a_refused_region_fails_at_start_and_leaves_nothing(daemon):
    baseline = accounting(daemon)
    with pytest.raises(cv.OffloadConfigError, match="refused the KV offload region.*Lower cpu_bytes_to_use"):
        vs.create_spec(*vs.make_config("toobig", num_cpu_blocks=20000))  # 20000 x 18432 > 256M pool
    assert daemon.leases() == [] and accounting(daemon) == baseline
    assert shm_files("toobig") == []


def test_a_lease_of_another_size_under_the_engines_name_is_refused(daemon):
    keep = cxlpool.Client().allocate(4096, name="vllm-kv-clash")
    try:
        with pytest.raises(cv.OffloadConfigError, match="holds 4096 bytes but this engine's config gives 129024"):
            vs.create_spec(*vs.make_config("clash"))
    finally:
        keep.release()


@pytest.mark.parametrize("extra, message", [
    ({"cpu_bytes_to_use": None}, "set kv_connector_extra_config.cpu_bytes_to_use"),
    ({"cpu_bytes_to_use": 1000}, "holds no block"),
    ({"block_size": 24}, "not a multiple of the GPU block size 16"),
])
def test_bad_config_is_refused_before_the_pool_is_asked(daemon, extra, message):
    with pytest.raises(cv.OffloadConfigError, match=message):
        vs.create_spec(*vs.make_config("badcfg", **extra))
    assert daemon.leases() == []


def test_layout_is_exactly_the_config():
    vllm_config, kv_cache_config = vs.make_config("x", cpu_bytes_to_use=1_000_000)
    lay = cv.RegionLayout.from_config(vllm_config, kv_cache_config,
                                      vllm_config.kv_transfer_config.kv_connector_extra_config)
    cell = vs.PAGE_BYTES * vs.LAYERS * 2
    assert (lay.cell_bytes, lay.row_bytes, lay.block_size_factor) == (cell, 2 * cell, 2)
    assert lay.num_blocks == 1_000_000 // (2 * cell) and lay.total_bytes == lay.num_blocks * 2 * cell


def test_import_never_needs_vllm():
    code = ("import sys, cxlpool, cxlpool.vllm as cv\n"
            "assert 'vllm' not in sys.modules\n"
            "try:\n    cv.CxlpoolOffloadingSpec\nexcept ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert "needs vLLM 0.26.0" in r.stdout
