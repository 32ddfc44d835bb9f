#!/usr/bin/env python3
"""Prefix reuse through a named lease: one process computes the KV cache of a
shared prompt prefix and stores its blocks in a cxlpool named lease; another
attaches the lease, restores the blocks and goes on decoding. Its logits must
equal recomputing everything from scratch.

    PYTHONPATH=build/python python3 examples/kv_offload.py            # check, 128..2048 tokens
    PYTHONPATH=build/python python3 examples/kv_offload.py --bench    # + restore vs recompute, median of 20
    PYTHONPATH=build/python python3 examples/kv_offload.py --quick    # tiny model, short prefixes (CI)

The model is GPT-2-shaped (learned positions, pre-LayerNorm blocks, causal
multi-head attention, GELU MLP, tied LM head) in plain PyTorch with random
weights from a fixed seed, so both processes build the same one. Its KV
cache is paged like an engine's: blocks of 16 tokens, each block holding
K and V of every layer, ``(blocks, layers, 2, heads, 16, head_dim)``; the
lease holds the same blocks, so a restore is one copy of ``n`` blocks (on a
GPU: one host-to-device DMA from the registered lease).

Process A (``--role store``, started by this script) prefills the longest
prefix and writes its blocks into the lease ``--name``; this process (B)
attaches the lease, and for every prefix length restores its first blocks,
decodes ``--decode`` more tokens and compares the logits with a from-scratch
prefill of prefix + continuation. ``--bench`` times the restore against the
prefill it replaces (median of ``--runs``, >= 20 by default) and prints the
ratio at each length.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import cxlpool.torch as ct

BLOCK = 16


class Model(torch.nn.Module):
    """A GPT-2-shaped decoder over a paged KV cache."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, max_pos: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(max_pos, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(torch.nn.ModuleDict({
                "ln1": torch.nn.LayerNorm(d), "qkv": torch.nn.Linear(d, 3 * d),
                "proj": torch.nn.Linear(d, d), "ln2": torch.nn.LayerNorm(d),
                "fc": torch.nn.Linear(d, 4 * d), "out": torch.nn.Linear(4 * d, d)}))
        self.lnf = torch.nn.LayerNorm(d)
        for p in self.parameters():  # GPT-2's init scale, so activations stay sane
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)

    def cache(self, tokens: int, device: torch.device) -> torch.Tensor:
        blocks = -(-tokens // BLOCK)
        return torch.zeros((blocks, len(self.blocks), 2, self.heads, BLOCK, self.hd), device=device)

    def forward(self, ids: torch.Tensor, cache: torch.Tensor, start: int, last_only: bool = False) -> torch.Tensor:
        """Logits of ``ids`` (1-D) at positions start.. (only the last one
        with last_only, as an engine's prefill), reading positions < start
        from ``cache`` and writing the new K/V into it."""
        n, end = ids.numel(), start + ids.numel()
        x = self.wte(ids) + self.wpe(torch.arange(start, end, device=ids.device))
        nb = -(-end // BLOCK)
        for li, b in enumerate(self.blocks):
            q, k, v = b["qkv"](b["ln1"](x)).view(n, 3, self.heads, self.hd).unbind(1)
            _write(cache, li, start, k, v)
            kv = cache[:nb, li].permute(1, 2, 0, 3, 4).reshape(2, self.heads, nb * BLOCK, self.hd)
            keys, vals = kv[0, :, :end], kv[1, :, :end]
            att = (q.transpose(0, 1) @ keys.transpose(1, 2)) / self.hd ** 0.5
            mask = torch.arange(end, device=ids.device)[None, :] > torch.arange(start, end, device=ids.device)[:, None]
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            x = x + b["proj"]((att @ vals).transpose(0, 1).reshape(n, -1))
            x = x + b["out"](F.gelu(b["fc"](b["ln2"](x))))
        if last_only:
            x = x[-1:]
        return self.lnf(x) @ self.wte.weight.t()


def _write(cache: torch.Tensor, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Writes K/V of positions start.. into their blocks."""
    pos = start
    while pos < start + k.shape[0]:
        blk, off = divmod(pos, BLOCK)
        take = min(BLOCK - off, start + k.shape[0] - pos)
        i = pos - start
        cache[blk, layer, 0, :, off:off + take] = k[i:i + take].transpose(0, 1)
        cache[blk, layer, 1, :, off:off + take] = v[i:i + take].transpose(0, 1)
        pos += take


def build(args: argparse.Namespace, device: torch.device) -> tuple[Model, torch.Tensor, torch.Tensor]:
    torch.manual_seed(args.seed)
    model = Model(args.vocab, args.dim, args.layers, args.heads, max(args.lengths) + args.decode)
    model = model.to(device).eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    prefix = torch.randint(args.vocab, (max(args.lengths),), generator=gen).to(device)
    cont = torch.randint(args.vocab, (args.decode,), generator=gen).to(device)
    return model, prefix, cont


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def role_store(args: argparse.Namespace, device: torch.device) -> None:
    """Process A: prefill the longest prefix, store its blocks in the lease."""
    model, prefix, _ = build(args, device)
    cache = model.cache(prefix.numel(), device)
    with torch.no_grad():
        model(prefix, cache, 0, last_only=True)
    shared = ct.empty(tuple(cache.shape), dtype=torch.float32, name=args.name, label="kv-offload-demo",
                      register=device.type == "cuda")
    shared.copy_(cache)
    sync(device)
    lease = ct.lease_of(shared)
    print(f"A: stored {cache.shape[0]} blocks ({prefix.numel()} tokens, {lease.requested_size} bytes) "
          f"in '{args.name}' (lease {lease.id}, node {lease.numa_node})", flush=True)
    sys.stdin.read()  # holds the lease until B is done


def median_time(fn, runs: int, device: torch.device) -> float:
    times = []
    for _ in range(runs):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def role_restore(args: argparse.Namespace, device: torch.device) -> int:
    """Process B: restore each prefix from the lease, decode, compare."""
    model, prefix, cont = build(args, device)
    nb_max = -(-max(args.lengths) // BLOCK)
    shape = (nb_max, args.layers, 2, args.heads, BLOCK, args.dim // args.heads)
    t0 = time.perf_counter()
    shared = ct.attach(args.name, shape, torch.float32, register=device.type == "cuda")
    print(f"B: attached '{args.name}' in {1e3 * (time.perf_counter() - t0):.2f} ms", flush=True)
    failures = 0
    rows = []
    with torch.no_grad():
        for length in args.lengths:
            nb = length // BLOCK
            cache = model.cache(length + args.decode, device)

            def restore() -> None:
                cache[:nb].copy_(shared[:nb], non_blocking=True)

            def recompute() -> None:
                model(prefix[:length], cache, 0, last_only=True)

            restore()
            sync(device)
            got = torch.cat([model(cont[i:i + 1], cache, length + i) for i in range(args.decode)])
            ref = model(torch.cat([prefix[:length], cont]), model.cache(length + args.decode, device), 0)[length:]
            ok = torch.allclose(got, ref, rtol=args.tol, atol=args.tol)
            failures += not ok
            print(f"B: prefix {length:5d} tokens: {nb} blocks restored, {args.decode} tokens decoded, "
                  f"logits {'match' if ok else 'DIFFER'} recompute (max |diff| "
                  f"{(got - ref).abs().max().item():.2e})", flush=True)
            if args.bench:
                rows.append((length, median_time(restore, args.runs, device),
                             median_time(recompute, args.runs, device)))
    if rows:
        print(f"\nrestore from the lease vs recompute on {device.type} "
              f"(median of {args.runs} runs; {args.layers} layers, d={args.dim}, fp32)")
        print(f"{'prefix':>7} {'KV bytes':>10} {'restore ms':>11} {'recompute ms':>13} {'ratio':>10}")
        kv_per_token = args.layers * 2 * args.dim * 4
        for length, r, c in rows:
            print(f"{length:7d} {length * kv_per_token:10d} {1e3 * r:11.3f} {1e3 * c:13.2f} {r / c:9.5f}x")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["store", "restore", "both"], default="both")
    ap.add_argument("--name", default=f"kv-offload-demo-{os.getpid()}")
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                    default=[128, 256, 512, 1024, 2048])
    ap.add_argument("--decode", type=int, default=8, help="tokens decoded after the prefix")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bench", action="store_true", help="time restore against recompute")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tol", type=float, default=None, help="allclose rtol/atol (default 1e-4 CPU, 1e-3 GPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true",
                    help="a tiny model, prefixes of 32 and 64 tokens, 3 runs (CI)")
    args = ap.parse_args()
    if args.quick:
        args.lengths, args.layers, args.dim, args.heads, args.vocab, args.runs = [32, 64], 2, 64, 4, 512, 3
    if any(n <= 0 or n % BLOCK for n in args.lengths):
        ap.error(f"--lengths must be positive multiples of {BLOCK}")
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.tol is None:
        args.tol = 1e-3 if device.type == "cuda" else 1e-4
    if args.role == "store":
        role_store(args, device)
        return 0
    if args.role == "restore":
        return 1 if role_restore(args, device) else 0
    forward = [a for a in sys.argv[1:] if a not in ("--bench",)]
    a = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "store", "--name", args.name,
                          *forward], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = a.stdout.readline()
        if not line.startswith("A: stored"):
            print(f"process A failed: {line}{a.stdout.read()}", file=sys.stderr)
            return 1
        print(line, end="", flush=True)
        failures = role_restore(args, device)
    finally:
        a.stdin.close()
        a.wait(timeout=60)
    print(f"{'all' if not failures else 'NOT all'} {len(args.lengths)} prefix lengths match recompute")
    return 1 if failures or a.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
