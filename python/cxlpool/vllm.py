"""vLLM's CPU KV offload on one pooled region: an offloading spec for vLLM's
``OffloadingConnector`` whose CPU tier lives in a cxlpool named shared lease.

Target release: **vLLM 0.26.0** (``vllm/v1/kv_offload``: ``spec.py``'s
``OffloadingSpec(vllm_config, kv_cache_config)`` with ``get_manager()`` and
``get_handlers(kv_caches: CanonicalKVCaches)``; ``abstract.py``'s
``OffloadingManager``/``PrepareStoreOutput``; ``mediums.py``'s
``CPULoadStoreSpec``/``GPULoadStoreSpec``; ``worker/worker.py``'s
``OffloadingHandler``/``TransferResult``). The shape was written from that
release line's source and is checked here by a contract test only
(docs/engines.md)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {
            "spec_name": "CxlpoolOffloadingSpec", "spec_module_path": "cxlpool.vllm",
            "cpu_bytes_to_use": 8000000000}}'

The region is the lease ``vllm-kv-<engine_id>``: ``num_cpu_blocks`` rows of
``world_size`` cells, one per TP worker, each holding that worker's canonical
KV tensors for one offloaded block back to back (the layout of vLLM's own
shared CPU region). Its size is exactly ``num_cpu_blocks x row bytes``; no
rounding to a power of two or a page. The first process of the engine to get
there (a worker: vLLM registers KV caches before it builds the scheduler)
creates it near its GPU, every other one attaches it by name and checks that
its size is the one its own config gives. It is gone when the last process
holding it dies, however it dies: nothing is left in /dev/shm.

Without a daemon, or when the pool refuses the region, the spec raises at
construction (engine start) with what to do; it never falls back to /dev/shm.

vLLM is imported only when ``CxlpoolOffloadingSpec`` is looked up (as vLLM's
factory does), so ``import cxlpool`` and ``import cxlpool.vllm`` never need it.

kv_connector_extra_config keys read here:

=========================  ==================================================
``cpu_bytes_to_use``       region budget; num_cpu_blocks = budget // row bytes
``num_cpu_blocks``         the block count itself (instead of the budget)
``block_size``             offloaded block in tokens (a multiple of the GPU's)
``cxlpool_socket``         the daemon's socket (default: $CXLPOOL_SOCKET, else
                           libcxlpool's default)
``cxlpool_tier``           node kinds in order of preference ("dram", "cxl")
``cxlpool_numa_node``      place the region on this node
``cxlpool_strict``         refuse (not warn) when the region is not where it
                           should be: strict placement and a failed verify()
``cxlpool_register``       register with CUDA on each worker's device (default
                           True where a GPU holds the KV caches)
``cxlpool_owner_uid``      the uid that owns the lease, when the engine's
                           processes run as different users
=========================  ==================================================
"""

from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable

from . import Client, Lease
from .errors import AlreadyExistsError, Error, NotFoundError, UnavailableError

# CxlpoolOffloadingSpec (and its manager and handler) are built on first
# lookup, see __getattr__; they are not in __all__ so that a star import
# never needs vLLM.
__all__ = ["VLLM_RELEASE", "OffloadConfigError", "RegionLayout", "PooledKVRegion", "BlockTable", "region_name"]

VLLM_RELEASE = "0.26.0"
_log = logging.getLogger("cxlpool.vllm")


class OffloadConfigError(RuntimeError):
    """The engine's configuration or the pool cannot give the offload region.
    Raised at engine start; the message says what to do."""


def region_name(engine_id: str) -> str:
    """The lease every process of one engine finds the region by."""
    return f"vllm-kv-{engine_id}"


@dataclass(frozen=True)
class RegionLayout:
    """Geometry of the region, from vLLM's config alone (scheduler and every
    worker compute the same): ``num_blocks`` rows of ``world_size`` cells of
    ``cell_bytes`` (one worker's canonical tensors for one offloaded block)."""

    num_blocks: int
    world_size: int
    cell_bytes: int
    block_size_factor: int
    offloaded_block_tokens: int

    @property
    def row_bytes(self) -> int:
        return self.cell_bytes * self.world_size

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.row_bytes

    @classmethod
    def from_config(cls, vllm_config: Any, kv_cache_config: Any, extra: dict) -> "RegionLayout":
        groups = list(kv_cache_config.kv_cache_groups)
        if len(groups) != 1:
            raise OffloadConfigError(
                f"cxlpool.vllm: {len(groups)} KV cache groups (a hybrid model); the pooled CPU "
                "tier supports one group, as vLLM's own CPU spec does")
        spec = groups[0].kv_cache_spec
        gpu_tokens = int(spec.block_size)
        offloaded = int(extra.get("block_size", gpu_tokens))
        if offloaded <= 0 or offloaded % gpu_tokens:
            raise OffloadConfigError(
                f"cxlpool.vllm: block_size {offloaded} is not a multiple of the GPU block size "
                f"{gpu_tokens}; set kv_connector_extra_config.block_size to one")
        factor = offloaded // gpu_tokens
        cell = int(spec.page_size_bytes) * len(kv_cache_config.kv_cache_tensors) * factor
        world = int(vllm_config.parallel_config.world_size)
        if cell <= 0 or world <= 0:
            raise OffloadConfigError(f"cxlpool.vllm: empty KV geometry (cell {cell} bytes, world {world})")
        if extra.get("num_cpu_blocks") is not None:
            blocks = int(extra["num_cpu_blocks"])
        elif extra.get("cpu_bytes_to_use"):
            blocks = int(extra["cpu_bytes_to_use"]) // (cell * world)
        else:
            raise OffloadConfigError(
                "cxlpool.vllm: set kv_connector_extra_config.cpu_bytes_to_use (bytes) or num_cpu_blocks")
        if blocks <= 0:
            raise OffloadConfigError(
                f"cxlpool.vllm: cpu_bytes_to_use {extra.get('cpu_bytes_to_use')} holds no block of "
                f"{cell * world} bytes; raise it")
        return cls(blocks, world, cell, factor, offloaded)


def _bool(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class PooledKVRegion:
    """The named lease of one engine's CPU tier, created or attached.

    ``open()`` creates it (placed near ``near_gpu``) or, when another process
    of the engine already did, attaches it and checks its size. Raises
    OffloadConfigError with what to do (no daemon, pool refusal, a lease of
    that name with another size)."""

    def __init__(self, client: Client, lease: Lease, layout: RegionLayout, created: bool) -> None:
        self.client = client
        self.lease = lease
        self.layout = layout
        self.created = created
        self.registered_device: int | None = None

    @classmethod
    def open(cls, engine_id: str, layout: RegionLayout, extra: dict, near_gpu: int | None) -> "PooledKVRegion":
        socket = extra.get("cxlpool_socket") or os.environ.get("CXLPOOL_SOCKET")
        try:
            client = Client(socket)
        except (UnavailableError, NotFoundError) as e:
            raise OffloadConfigError(
                f"cxlpool.vllm: no cxlpoold at {socket or 'the default socket'} ({e.message}): start "
                "cxlpoold (systemctl start cxlpoold.socket) or set kv_connector_extra_config."
                "cxlpool_socket / $CXLPOOL_SOCKET to its socket; the KV offload region is not "
                "placed in /dev/shm instead") from e
        name = region_name(engine_id)
        owner = extra.get("cxlpool_owner_uid")
        lease, created = None, False
        if owner is None or int(owner) == os.getuid():
            lease, created = cls._create(client, name, layout, extra, near_gpu)
        if lease is None:
            lease = cls._attach(client, name, None if owner is None else int(owner))
        if lease.requested_size != layout.total_bytes:
            size = lease.requested_size
            lease.release()
            raise OffloadConfigError(
                f"cxlpool.vllm: lease '{name}' holds {size} bytes but this engine's config gives "
                f"{layout.total_bytes} ({layout.num_blocks} blocks x {layout.row_bytes}); another "
                "engine uses this engine_id, or its processes disagree on the KV config")
        return cls(client, lease, layout, created)

    @staticmethod
    def _create(client: Client, name: str, layout: RegionLayout, extra: dict,
                near_gpu: int | None) -> tuple[Lease | None, bool]:
        numa = extra.get("cxlpool_numa_node")
        try:
            lease = client.allocate(
                layout.total_bytes, name=name, near_gpu=near_gpu, tier=extra.get("cxlpool_tier"),
                numa_node=None if numa is None else int(numa),
                strict=_bool(extra.get("cxlpool_strict"), False),
                long_term_pin=near_gpu is not None, label="vllm-kv-offload")
        except AlreadyExistsError:
            return None, False
        except Error as e:
            raise OffloadConfigError(
                f"cxlpool.vllm: the pool refused the KV offload region '{name}' of "
                f"{layout.total_bytes} bytes ({layout.num_blocks} blocks): {e.message}. Lower "
                "cpu_bytes_to_use, raise the quota or pool capacity (cxlpoolctl pools, cxlpoolctl "
                "quotas), or drop the OffloadingConnector; nothing falls back to /dev/shm") from e
        return lease, True

    @staticmethod
    def _attach(client: Client, name: str, owner_uid: int | None) -> Lease:
        try:
            return client.attach(name, owner_uid)
        except NotFoundError as e:
            raise OffloadConfigError(
                f"cxlpool.vllm: lease '{name}' of uid {owner_uid} not found or not shared with "
                f"uid {os.getuid()} ({e.message}); run the engine's processes as its owner or "
                "list this uid in its ACL") from e

    def check_placement(self, strict: bool) -> None:
        """verify() where the pages are: a problem is a warning, or with
        strict an OffloadConfigError."""
        p = self.lease.verify()
        resident = p.pages_sampled - p.pages_absent
        if not p.moved and p.pages_on_node == resident:
            return
        msg = (f"cxlpool.vllm: region '{self.lease.name}' was placed on node {p.numa_node} but "
               f"{resident - p.pages_on_node} of {resident} sampled pages are elsewhere (node "
               f"{p.placed_numa_node}); a pin moved them, or the node lacks kernel-zone memory "
               "(cxlpoolctl pools)")
        if strict:
            raise OffloadConfigError(msg + "; refusing (cxlpool_strict)")
        _log.warning("%s", msg)

    def register(self, device: int) -> None:
        """cuMemHostRegister through cxlpool's CUDA path on this worker's device."""
        self.lease.cuda_register(device)
        self.registered_device = device

    def bytes_view(self):
        """The region as an int8 tensor of exactly total_bytes."""
        import torch
        from torch.utils import dlpack

        return dlpack.from_dlpack(self.lease.window(0, self.layout.total_bytes)).view(torch.int8)

    def worker_views(self, rank: int, page_sizes: list[int]) -> list:
        """One (num_blocks, factor, page) view per canonical tensor of worker
        ``rank``: its cell of every row, tensors back to back."""
        import torch

        lay = self.layout
        if sum(page_sizes) * lay.block_size_factor != lay.cell_bytes:
            raise OffloadConfigError(
                f"cxlpool.vllm: the worker's KV tensors hold {sum(page_sizes)} bytes a GPU block "
                f"(x{lay.block_size_factor}) but the config gives {lay.cell_bytes} a cell")
        base, views = self.bytes_view(), []
        offset = rank * lay.cell_bytes
        for page in page_sizes:
            views.append(torch.as_strided(base, (lay.num_blocks, lay.block_size_factor, page),
                                          (lay.row_bytes, page, 1), offset))
            offset += page * lay.block_size_factor
        return views


class BlockTable:
    """The scheduler's map of block hash -> CPU block id, LRU, with the
    reference counts vLLM's manager API implies: a block being stored is not
    loadable, a block being loaded is not evictable."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks - 1, -1, -1))
        self.blocks: "collections.OrderedDict[Any, list]" = collections.OrderedDict()  # hash -> [id, ready, readers]

    def lookup(self, hashes: Iterable[Any]) -> int:
        hits = 0
        for h in hashes:
            entry = self.blocks.get(h)
            if entry is None or not entry[1]:
                break
            hits += 1
        return hits

    def prepare_load(self, hashes: Iterable[Any]) -> list[int]:
        ids = []
        for h in hashes:
            entry = self.blocks[h]
            assert entry[1], f"block {h!r} is not stored yet"
            entry[2] += 1
            ids.append(entry[0])
        return ids

    def touch(self, hashes: Iterable[Any]) -> None:
        for h in reversed(list(hashes)):
            if h in self.blocks:
                self.blocks.move_to_end(h)

    def complete_load(self, hashes: Iterable[Any]) -> None:
        for h in hashes:
            entry = self.blocks[h]
            assert entry[2] > 0, f"block {h!r} was not being loaded"
            entry[2] -= 1

    def prepare_store(self, hashes: Iterable[Any]) -> tuple[list, list[int], list] | None:
        new = [h for h in hashes if h not in self.blocks]
        need = len(new) - len(self.free)
        victims = []
        if need > 0:
            for h, (bid, ready, readers) in self.blocks.items():
                if len(victims) == need:
                    break
                if ready and readers == 0:
                    victims.append(h)
            if len(victims) < need:
                return None
        for h in victims:
            self.free.append(self.blocks.pop(h)[0])
        ids = []
        for h in new:
            bid = self.free.pop()
            self.blocks[h] = [bid, False, 0]
            ids.append(bid)
        return new, ids, victims

    def complete_store(self, hashes: Iterable[Any], success: bool) -> None:
        for h in hashes:
            entry = self.blocks.get(h)
            if entry is None or entry[1]:
                continue
            if success:
                entry[1] = True
            else:
                self.free.append(self.blocks.pop(h)[0])


class BlockCopier:
    """One direction of a worker's transfers between its KV tensors and its
    cells of the region. On a GPU the copies are queued on a stream of their
    own and finish when their event has; on the CPU they finish at once."""

    def __init__(self, gpu_tensors: list, cpu_views: list, to_cpu: bool, result_cls: Any,
                 transfer_type: tuple[str, str]) -> None:
        import torch

        self.gpu, self.cpu, self.to_cpu = gpu_tensors, cpu_views, to_cpu
        self.result_cls, self.transfer_type = result_cls, transfer_type
        self.factor = cpu_views[0].shape[1] if cpu_views else 1
        cuda = bool(gpu_tensors) and gpu_tensors[0].is_cuda
        self.stream = torch.cuda.Stream(device=gpu_tensors[0].device) if cuda else None
        self.pending: list[tuple[int, Any, int, Any]] = []

    def _gpu_ids(self, spec: Any) -> tuple[Any, int]:
        import torch

        ids = torch.as_tensor(spec.block_ids, dtype=torch.long)
        skip = 0
        indices = getattr(spec, "block_indices", None)
        if indices:
            skip = int(indices[0]) % self.factor
        return ids, skip

    def submit(self, job_id: int, src: Any, dst: Any) -> bool:
        import torch

        gpu_spec, cpu_spec = (src, dst) if self.to_cpu else (dst, src)
        gpu_ids, skip = self._gpu_ids(gpu_spec)
        cpu_ids = torch.as_tensor(cpu_spec.block_ids, dtype=torch.long)
        if self.stream is None:
            nbytes = self._copy_on_cpu(gpu_ids, cpu_ids, skip)
            self.pending.append((job_id, None, nbytes, None))
            return True
        self.stream.wait_stream(torch.cuda.current_stream(self.gpu[0].device))
        with torch.cuda.stream(self.stream):
            nbytes, staged = self._copy_on_gpu(gpu_ids, cpu_ids, skip)
            event = torch.cuda.Event()
            event.record(self.stream)
        # The staging tensors live until the copies that read them are done.
        self.pending.append((job_id, event, nbytes, staged))
        return True

    def _copy_on_cpu(self, gpu_ids: Any, cpu_ids: Any, skip: int) -> int:
        nbytes = 0
        for t, v in zip(self.gpu, self.cpu):
            page = v.shape[2]
            if self.to_cpu:  # stores are whole offloaded blocks: factor GPU blocks each
                v[cpu_ids] = t[gpu_ids].view(len(cpu_ids), self.factor, page)
            else:
                t[gpu_ids] = v[cpu_ids].reshape(-1, page)[skip:skip + len(gpu_ids)]
            nbytes += len(gpu_ids) * page
        return nbytes

    def _copy_on_gpu(self, gpu_ids: Any, cpu_ids: Any, skip: int) -> tuple[int, list]:
        """Gathers/scatters on the GPU and moves each offloaded block with
        one asynchronous copy from or to its (registered) cell."""
        import torch

        nbytes, staged = 0, []
        ids = gpu_ids.to(self.gpu[0].device, non_blocking=True)
        cpu_list = cpu_ids.tolist()
        for t, v in zip(self.gpu, self.cpu):
            page = v.shape[2]
            if self.to_cpu:
                g = t[ids].view(len(cpu_list), self.factor, page)
                for j, b in enumerate(cpu_list):
                    v[b].copy_(g[j], non_blocking=True)
            else:
                g = torch.empty((len(cpu_list), self.factor, page), dtype=t.dtype, device=t.device)
                for j, b in enumerate(cpu_list):
                    g[j].copy_(v[b], non_blocking=True)
                t[ids] = g.view(-1, page)[skip:skip + len(gpu_ids)]
            staged.append(g)
            nbytes += len(gpu_ids) * page
        return nbytes, staged

    def finished(self) -> list:
        done, left = [], []
        for job in self.pending:
            job_id, event, nbytes, _ = job
            if event is None or event.query():
                done.append(self.result_cls(job_id=job_id, success=True, transfer_size=nbytes,
                                            transfer_type=self.transfer_type))
            else:
                left.append(job)
        self.pending = left
        return done

    def wait(self, job_ids: set[int]) -> None:
        for job_id, event, _, _ in self.pending:
            if job_id in job_ids and event is not None:
                event.synchronize()


def _current_gpu() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return int(torch.cuda.current_device()) if torch.cuda.is_available() else None


def _build_classes() -> dict[str, type]:
    """vLLM's interface classes, imported now, and ours built on them."""
    from vllm.v1.kv_offload.abstract import OffloadingManager, PrepareStoreOutput
    from vllm.v1.kv_offload.mediums import CPULoadStoreSpec, GPULoadStoreSpec
    from vllm.v1.kv_offload.spec import OffloadingSpec
    from vllm.v1.kv_offload.worker.worker import OffloadingHandler, TransferResult

    class CxlpoolOffloadingManager(OffloadingManager):
        """vLLM's scheduler-side manager over the region's block ids."""

        def __init__(self, num_blocks: int) -> None:
            self.table = BlockTable(num_blocks)

        def lookup(self, block_hashes):
            return self.table.lookup(block_hashes)

        def prepare_load(self, block_hashes):
            return CPULoadStoreSpec(self.table.prepare_load(block_hashes))

        def touch(self, block_hashes):
            self.table.touch(block_hashes)

        def complete_load(self, block_hashes):
            self.table.complete_load(block_hashes)

        def prepare_store(self, block_hashes):
            out = self.table.prepare_store(block_hashes)
            if out is None:
                return None
            new, ids, evicted = out
            return PrepareStoreOutput(block_hashes_to_store=new, store_spec=CPULoadStoreSpec(ids),
                                      block_hashes_evicted=evicted)

        def complete_store(self, block_hashes, success=True):
            self.table.complete_store(block_hashes, success)

    class CxlpoolOffloadingHandler(OffloadingHandler):
        """vLLM's worker-side handler of one direction (GPU->CPU or CPU->GPU)."""

        def __init__(self, copier: BlockCopier) -> None:
            self.copier = copier

        def transfer_async(self, job_id, spec):
            src, dst = spec
            return self.copier.submit(job_id, src, dst)

        def get_finished(self):
            return self.copier.finished()

        def wait(self, job_ids):
            self.copier.wait(job_ids)

    class CxlpoolOffloadingSpec(OffloadingSpec):
        """OffloadingSpec whose CPU tier is the engine's named lease."""

        def __init__(self, vllm_config, kv_cache_config=None):
            super().__init__(vllm_config, kv_cache_config)
            if kv_cache_config is None:
                raise OffloadConfigError("cxlpool.vllm needs the KVCacheConfig (vLLM passes it)")
            extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
            self.layout = RegionLayout.from_config(vllm_config, kv_cache_config, extra)
            self.rank = int(vllm_config.parallel_config.rank) % self.layout.world_size
            self.strict = _bool(extra.get("cxlpool_strict"), False)
            self.register_cuda = extra.get("cxlpool_register")
            engine_id = str(vllm_config.kv_transfer_config.engine_id)
            self.region = PooledKVRegion.open(engine_id, self.layout, extra, _current_gpu())
            self.region.check_placement(self.strict)
            self._manager = None
            self._handlers = None

        def get_manager(self):
            if self._manager is None:
                self._manager = CxlpoolOffloadingManager(self.layout.num_blocks)
            return self._manager

        def get_handlers(self, kv_caches, attn_backends=None):
            if self._handlers is None:
                self._handlers = self._make_handlers(kv_caches)
            store, load = self._handlers
            yield GPULoadStoreSpec, CPULoadStoreSpec, store
            yield CPULoadStoreSpec, GPULoadStoreSpec, load

        def _make_handlers(self, kv_caches):
            import torch

            if len(kv_caches.group_data_refs) != 1:
                raise OffloadConfigError("cxlpool.vllm supports one KV cache group")
            tensors = [c.tensor for c in kv_caches.tensors]
            pages = [int(c.page_size_bytes) for c in kv_caches.tensors]
            for t, page in zip(tensors, pages):
                if t.dim() != 2 or not t.is_contiguous() or t.shape[1] * t.element_size() != page:
                    raise OffloadConfigError(
                        f"cxlpool.vllm: canonical KV tensor {tuple(t.shape)} {t.dtype} is not "
                        f"(num_blocks, {page}) bytes")
            gpu = [t.view(torch.int8) for t in tensors]
            if tensors and tensors[0].is_cuda and _bool(self.register_cuda, True):
                self.region.register(tensors[0].device.index or 0)
                self.region.check_placement(self.strict)
            views = self.region.worker_views(self.rank, pages)
            return (CxlpoolOffloadingHandler(BlockCopier(gpu, views, True, TransferResult, ("GPU", "CPU"))),
                    CxlpoolOffloadingHandler(BlockCopier(gpu, views, False, TransferResult, ("CPU", "GPU"))))

    return {
        "CxlpoolOffloadingSpec": CxlpoolOffloadingSpec,
        "CxlpoolOffloadingManager": CxlpoolOffloadingManager,
        "CxlpoolOffloadingHandler": CxlpoolOffloadingHandler,
    }


_built: dict[str, type] | None = None


def __getattr__(name: str) -> Any:
    """``CxlpoolOffloadingSpec`` and its manager/handler classes are built on
    vLLM's base classes on first lookup (vLLM's factory does
    ``getattr(module, spec_name)``)."""
    global _built
    if name in ("CxlpoolOffloadingSpec", "CxlpoolOffloadingManager", "CxlpoolOffloadingHandler"):
        if _built is None:
            try:
                _built = _build_classes()
            except ImportError as e:
                raise ImportError(
                    f"cxlpool.vllm.{name} needs vLLM {VLLM_RELEASE} (vllm.v1.kv_offload): {e}") from e
        return _built[name]
    raise AttributeError(f"module 'cxlpool.vllm' has no attribute {name!r}")

