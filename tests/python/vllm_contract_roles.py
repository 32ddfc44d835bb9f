"""The processes of the cxlpool.vllm contract test (test_vllm_contract.py).

    vllm_contract_roles.py scheduler ENGINE_ID
    vllm_contract_roles.py worker ENGINE_ID RANK
    vllm_contract_roles.py shm ENGINE_ID        # vLLM's /dev/shm approach, as a plain file

Each loads the spec as vLLM's factory does (vllm_standin.create_spec), prints
one JSON line when it is set up, then answers one JSON command a line on
stdin with one JSON line on stdout, in the order the test (the connector's
stand-in) sends them. At EOF it exits; the test SIGKILLs it before that.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_standin as vs  # noqa: E402

vs.install()


def pattern(rank: int, layer: int, gpu_block: int) -> torch.Tensor:
    """The bytes worker `rank` keeps in GPU block `gpu_block` of `layer`."""
    v = (torch.arange(vs.PAGE_BYTES) + rank * 71 + layer * 13 + gpu_block * 7) % 251 - 125
    return v.to(torch.int8)


def reply(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def commands():
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


def scheduler(engine_id: str) -> None:
    vllm_config, kv_cache_config = vs.make_config(engine_id)
    spec = vs.create_spec(vllm_config, kv_cache_config)
    mgr = spec.get_manager()
    lease = spec.region.lease
    reply({"ready": True, "lease": lease.id, "num_blocks": spec.layout.num_blocks,
           "created": spec.region.created})
    for cmd in commands():
        op, hashes = cmd["op"], cmd.get("hashes", [])
        if op == "lookup":
            reply({"hits": mgr.lookup(hashes)})
        elif op == "prepare_store":
            out = mgr.prepare_store(hashes)
            reply({"store": None} if out is None else {
                "store": out.block_hashes_to_store, "ids": out.store_spec.block_ids.tolist(),
                "evicted": out.block_hashes_evicted, "medium": out.store_spec.medium()})
        elif op == "complete_store":
            mgr.complete_store(hashes, cmd.get("success", True))
            reply({})
        elif op == "prepare_load":
            s = mgr.prepare_load(hashes)
            reply({"ids": s.block_ids.tolist(), "medium": s.medium()})
        elif op == "touch":
            mgr.touch(hashes)
            reply({})
        elif op == "complete_load":
            mgr.complete_load(hashes)
            reply({})
        elif op == "check_cells":
            reply({"match": check_cells(spec, cmd["ids"], cmd["first_gpu_block"])})


def check_cells(spec, cpu_ids: list[int], first_gpu_block: int) -> bool:
    """The scheduler's own mapping holds both workers' stores: CPU block
    cpu_ids[k] holds GPU blocks first+2k, first+2k+1 of every layer and rank."""
    for rank in range(vs.WORLD_SIZE):
        views = spec.region.worker_views(rank, [vs.PAGE_BYTES] * vs.LAYERS)
        for layer, v in enumerate(views):
            for k, b in enumerate(cpu_ids):
                for sub in range(2):
                    g = first_gpu_block + 2 * k + sub
                    if not torch.equal(v[b, sub], pattern(rank, layer, g)):
                        return False
    return True


def worker(engine_id: str, rank: int) -> None:
    vllm_config, kv_cache_config = vs.make_config(engine_id, rank=rank)
    spec = vs.create_spec(vllm_config, kv_cache_config)
    tensors = [torch.stack([pattern(rank, layer, g) for g in range(vs.NUM_GPU_BLOCKS)])
               for layer in range(vs.LAYERS)]
    kv = vs.CanonicalKVCaches(
        tensors=[vs.CanonicalKVCacheTensor(t, vs.PAGE_BYTES) for t in tensors],
        group_data_refs=[[vs.CanonicalKVCacheRef(i, vs.PAGE_BYTES) for i in range(vs.LAYERS)]])
    handlers = {(s.medium(), d.medium()): h for s, d, h in spec.get_handlers(kv)}
    reply({"ready": True, "lease": spec.region.lease.id, "handlers": sorted("->".join(k) for k in handlers)})
    for cmd in commands():
        job, gpu, cpu = cmd["job"], cmd["gpu"], cmd["cpu"]
        if cmd["op"] == "store":
            src, dst = vs.GPULoadStoreSpec(gpu, [len(gpu)]), vs.CPULoadStoreSpec(cpu)
        else:
            for t in tensors:
                t[gpu] = 0
            src = vs.CPULoadStoreSpec(cpu)
            dst = vs.GPULoadStoreSpec(gpu, [len(gpu)], block_indices=[cmd["first_index"]])
        h = handlers[(src.medium(), dst.medium())]
        assert h.transfer_async(job, (src, dst))
        result = wait_finished(h, job)
        out = {"done": result.job_id, "success": result.success, "bytes": result.transfer_size}
        if cmd["op"] == "load":
            out["match"] = all(torch.equal(t[g], pattern(rank, layer, e))
                               for layer, t in enumerate(tensors)
                               for g, e in zip(gpu, cmd["expect"]))
        reply(out)


def wait_finished(handler, job: int, timeout: float = 30.0):
    """Polls get_finished() as the connector's worker does each step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in handler.get_finished():
            if r.job_id == job:
                return r
        handler.wait({job})
    raise TimeoutError(f"transfer {job} did not finish")


def shm(engine_id: str) -> None:
    """What vLLM's own CPU spec does with its region: a named tmpfs file that
    the creator sizes and every process maps."""
    path = f"/dev/shm/vllm_offload_{engine_id}.mmap"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, vs.REGION_BYTES)
    m = mmap.mmap(fd, vs.REGION_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    m[:5] = b"kvkv!"
    reply({"ready": True, "path": path})
    for _ in commands():
        reply({})


if __name__ == "__main__":
    role, engine = sys.argv[1], sys.argv[2]
    if role == "scheduler":
        scheduler(engine)
    elif role == "worker":
        worker(engine, int(sys.argv[3]))
    else:
        shm(engine)
