#!/usr/bin/env python3
"""A KV-cache block pool in a shared named lease, used by two processes, the
way offload engines (vLLM's CPU offload, LMCache, SGLang's HiCache) keep
evicted KV blocks in host memory.

The scheduler process creates the pool: one named lease holding a small
header (geometry and a per-block table: owner sequence, tokens, checksum)
and `--blocks` KV blocks of shape [2 (k, v), tokens, heads, head_dim]. It
"prefills" sequences into blocks, then starts a worker process (a
tensor-parallel rank would be one) that attaches the same lease by name,
checks every block it is told to read, and writes a new block for each one
(k and v scaled by 2, as a stand-in for a decode step). With a GPU the worker
copies each block to the GPU and back (non_blocking: the lease is pinned
memory) and computes there. The scheduler then checks the worker's blocks
byte for byte.

    python3 examples/kv_cache_pool.py                  # 64 blocks, 8 sequences
    python3 examples/kv_cache_pool.py --blocks 1024 --tokens 16 --heads 8 --head-dim 128

Exit status 0 when every block checks out. Needs a running cxlpoold
($CXLPOOL_SOCKET or the default socket).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

import cxlpool
import cxlpool.torch as ct

MAGIC = 0x4B56504F4F4C0001  # "KVPOOL", version 1
HEADER_BYTES = 1 << 16
# header int64 words: magic, blocks, tokens, heads, head_dim, dtype code;
# then per block (from word 16): sequence id (-1 free), tokens, checksum bits
DTYPES = {1: torch.float16, 2: torch.bfloat16, 3: torch.float32}
CODES = {v: k for k, v in DTYPES.items()}


class Pool:
    """Views of the pool's lease: the header words and the blocks."""

    def __init__(self, raw: torch.Tensor) -> None:
        self.raw = raw
        self.words = raw[:HEADER_BYTES].view(torch.int64)
        if int(self.words[0]) != MAGIC:
            raise SystemExit("kv-pool: the lease does not hold a KV pool (bad magic)")
        blocks, tokens, heads, dim, code = (int(x) for x in self.words[1:6])
        self.dtype = DTYPES[code]
        self.shape = (blocks, 2, tokens, heads, dim)
        self.kv = raw[HEADER_BYTES:].view(self.dtype)[: blocks * 2 * tokens * heads * dim].view(self.shape)
        self.table = self.words[16 : 16 + 3 * blocks].view(blocks, 3)

    @staticmethod
    def create(name: str, blocks: int, tokens: int, heads: int, dim: int, dtype: torch.dtype, tier) -> "Pool":
        block_bytes = 2 * tokens * heads * dim * torch.empty((), dtype=dtype).element_size()
        if 16 + 3 * blocks > HEADER_BYTES // 8:
            raise SystemExit(f"kv-pool: at most {HEADER_BYTES // 8 // 3 - 6} blocks")
        raw = ct.empty(HEADER_BYTES + blocks * block_bytes, dtype=torch.uint8, name=name, tier=tier,
                       label="kv-cache-pool")
        raw[:HEADER_BYTES].zero_()
        w = raw[:HEADER_BYTES].view(torch.int64)
        w[1:6] = torch.tensor([blocks, tokens, heads, dim, CODES[dtype]])
        w[0] = MAGIC
        pool = Pool(raw)
        pool.table[:, 0] = -1
        return pool

    def checksum(self, b: int) -> int:
        return int(self.kv[b].double().sum().view(torch.int64))

    def write(self, b: int, seq: int, data: torch.Tensor) -> None:
        self.kv[b].copy_(data)
        self.table[b] = torch.tensor([seq, data.shape[1], self.checksum(b)])

    def free_blocks(self) -> list[int]:
        return [i for i in range(self.shape[0]) if int(self.table[i, 0]) == -1]


def scheduler(args) -> int:
    name = args.name or f"kv-pool-{os.getpid()}"
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    t0 = time.monotonic()
    pool = Pool.create(name, args.blocks, args.tokens, args.heads, args.head_dim, dtype, args.tier)
    lease = ct.lease_of(pool.raw)
    gpu = torch.cuda.is_available()
    print(f"scheduler: pool '{name}': lease {lease.id}, {lease.size} bytes on node {lease.numa_node} "
          f"({lease.info.kind}, {lease.info.backing}), {args.blocks} blocks of {pool.shape[1:]} {dtype}, "
          f"pinned={pool.raw.is_pinned()}")
    free = pool.free_blocks()
    per_seq = max(1, args.blocks // (2 * args.sequences))
    jobs = []
    gen = torch.Generator().manual_seed(1234)
    for seq in range(args.sequences):
        for _ in range(per_seq):
            src, dst = free.pop(0), free.pop()
            data = torch.randn(pool.shape[1:], generator=gen).to(dtype)
            pool.write(src, seq, data)
            jobs.append({"seq": seq, "src": src, "dst": dst})
    print(f"scheduler: prefilled {len(jobs)} blocks for {args.sequences} sequences")

    worker = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "worker", "--name", name],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    out, _ = worker.communicate(json.dumps(jobs) + "\n", timeout=300)
    sys.stdout.write(out)
    if worker.returncode != 0:
        print(f"scheduler: worker failed (exit {worker.returncode})")
        return 1
    bad = 0
    for j in jobs:
        want = (pool.kv[j["src"]].float() * 2).to(dtype)
        row = pool.table[j["dst"]]
        if int(row[0]) != j["seq"] or not torch.equal(pool.kv[j["dst"]], want) or int(row[2]) != pool.checksum(j["dst"]):
            bad += 1
    holders = lease.info.holders
    print(f"scheduler: {len(jobs) - bad}/{len(jobs)} worker blocks verified "
          f"({'GPU' if gpu else 'CPU'} path, {time.monotonic() - t0:.2f} s, {holders} holder(s) now)")
    return 0 if bad == 0 else 1


def worker(args) -> int:
    jobs = json.loads(sys.stdin.readline())
    raw = ct.attach(args.name)  # the whole lease, registered when a GPU is there
    pool = Pool(raw)
    gpu = torch.cuda.is_available()
    stream = torch.cuda.Stream() if gpu else None
    for j in jobs:
        src, dst = j["src"], j["dst"]
        if int(pool.table[src, 0]) != j["seq"] or int(pool.table[src, 2]) != pool.checksum(src):
            print(f"worker: block {src} does not hold sequence {j['seq']} intact")
            return 1
        if gpu:
            with torch.cuda.stream(stream):
                dev = pool.kv[src].to("cuda", non_blocking=True)
                pool.kv[dst].copy_((dev.float() * 2).to(pool.dtype), non_blocking=True)
            stream.synchronize()
        else:
            pool.kv[dst].copy_((pool.kv[src].float() * 2).to(pool.dtype))
        pool.table[dst] = torch.tensor([j["seq"], pool.shape[2], pool.checksum(dst)])
    print(f"worker: attached '{args.name}' (lease {ct.lease_of(raw).id}), read and wrote {len(jobs)} blocks"
          f"{' through the GPU' if gpu else ''}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["scheduler", "worker"], default="scheduler")
    p.add_argument("--name", help="shared lease name (default kv-pool-<pid>)")
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    p.add_argument("--tier", help="node kinds in order, e.g. cxl,dram")
    args = p.parse_args()
    try:
        return scheduler(args) if args.role == "scheduler" else worker(args)
    except cxlpool.Error as e:
        print(f"kv-pool: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
