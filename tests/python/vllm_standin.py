"""A stand-in for the interface modules of vLLM 0.26.0's KV offload API, for
the contract test of cxlpool.vllm (vLLM itself cannot be installed here).

It provides, under vLLM's module paths, only what a third-party spec and its
caller touch: ``vllm.v1.kv_offload.spec`` (OffloadingSpec, CanonicalKVCaches,
CanonicalKVCacheTensor, CanonicalKVCacheRef), ``.abstract`` (LoadStoreSpec,
PrepareStoreOutput, OffloadingManager), ``.mediums`` (CPULoadStoreSpec,
GPULoadStoreSpec), ``.worker.worker`` (OffloadingHandler, TransferResult) and
``.factory.create_spec``, which loads a spec the way vLLM's
OffloadingSpecFactory does: ``spec_name`` + ``spec_module_path`` from
kv_connector_extra_config, ``importlib.import_module``, ``getattr``, an
``issubclass`` check, then ``spec_cls(vllm_config, kv_cache_config)``.
Written from the API's shape, not copied. ``make_config()`` builds the parts
of VllmConfig / KVCacheConfig the spec reads.
"""

from __future__ import annotations

import abc
import importlib
import sys
import types
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


def _module(name: str) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    sys.modules[name] = mod
    parent, _, leaf = name.rpartition(".")
    if parent:
        setattr(_module(parent), leaf, mod)
    return mod


class LoadStoreSpec(abc.ABC):
    @staticmethod
    @abc.abstractmethod
    def medium() -> str: ...


@dataclass
class PrepareStoreOutput:
    block_hashes_to_store: list
    store_spec: LoadStoreSpec
    block_hashes_evicted: list


class OffloadingManager(abc.ABC):
    @abc.abstractmethod
    def lookup(self, block_hashes) -> int: ...

    @abc.abstractmethod
    def prepare_load(self, block_hashes) -> LoadStoreSpec: ...

    def touch(self, block_hashes) -> None:
        return None

    def complete_load(self, block_hashes) -> None:
        return None

    @abc.abstractmethod
    def prepare_store(self, block_hashes) -> PrepareStoreOutput | None: ...

    def complete_store(self, block_hashes, success: bool = True) -> None:
        return None

    def take_events(self):
        return ()


class BlockIDsLoadStoreSpec(LoadStoreSpec, abc.ABC):
    def __init__(self, block_ids) -> None:
        import numpy as np

        self.block_ids = np.array(block_ids, dtype=np.int64)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids, group_sizes, block_indices=None) -> None:
        super().__init__(block_ids)
        assert sum(group_sizes) == len(block_ids)
        self.group_sizes = group_sizes
        self.block_indices = block_indices

    @staticmethod
    def medium() -> str:
        return "GPU"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    @staticmethod
    def medium() -> str:
        return "CPU"


@dataclass
class TransferResult:
    job_id: int
    success: bool
    transfer_size: int | None = None
    transfer_time: float | None = None
    transfer_type: tuple | None = None


class OffloadingHandler(abc.ABC):
    @abc.abstractmethod
    def transfer_async(self, job_id: int, spec) -> bool: ...

    @abc.abstractmethod
    def get_finished(self) -> list: ...

    @abc.abstractmethod
    def wait(self, job_ids: set) -> None: ...

    def shutdown(self) -> None:
        return None


@dataclass
class CanonicalKVCacheTensor:
    tensor: Any
    page_size_bytes: int


@dataclass
class CanonicalKVCacheRef:
    tensor_idx: int
    page_size_bytes: int


@dataclass
class CanonicalKVCaches:
    tensors: list
    group_data_refs: list = field(default_factory=list)


class OffloadingSpec(abc.ABC):
    """The base's constructor keeps the configs and the extra config, as
    vLLM's does; the spec computes its own geometry."""

    def __init__(self, vllm_config, kv_cache_config) -> None:
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config

    @abc.abstractmethod
    def get_manager(self) -> OffloadingManager: ...

    @abc.abstractmethod
    def get_handlers(self, kv_caches): ...


def create_spec(vllm_config, kv_cache_config) -> OffloadingSpec:
    """What vLLM's OffloadingSpecFactory does for a spec it has no entry for."""
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config
    spec_name = extra.get("spec_name", "CPUOffloadingSpec")
    module_path = extra.get("spec_module_path")
    if module_path is None:
        raise ValueError(f"Unsupported spec type: {spec_name}")
    spec_cls = getattr(importlib.import_module(module_path), spec_name)
    assert issubclass(spec_cls, OffloadingSpec)
    return spec_cls(vllm_config, kv_cache_config)


def install() -> None:
    """Puts the stand-in modules at vLLM's module paths."""
    for name, attrs in {
        "vllm.v1.kv_offload.abstract": (LoadStoreSpec, PrepareStoreOutput, OffloadingManager),
        "vllm.v1.kv_offload.mediums": (BlockIDsLoadStoreSpec, GPULoadStoreSpec, CPULoadStoreSpec),
        "vllm.v1.kv_offload.worker.worker": (OffloadingHandler, TransferResult),
        "vllm.v1.kv_offload.spec": (OffloadingSpec, CanonicalKVCaches, CanonicalKVCacheTensor,
                                    CanonicalKVCacheRef),
        "vllm.v1.kv_offload.factory": (create_spec,),
    }.items():
        mod = _module(name)
        for a in attrs:
            setattr(mod, a.__name__, a)


# The contract's geometry: 2 TP workers, 3 layers, GPU blocks of 16 tokens,
# offloaded blocks of 32 (factor 2), 7 CPU blocks: a region of 7 x 2 x 9216
# bytes = 129024, which is neither a power of two nor a whole number of pages.
WORLD_SIZE = 2
LAYERS = 3
GPU_BLOCK_TOKENS = 16
PAGE_BYTES = 2 * GPU_BLOCK_TOKENS * 3 * 8 * 2  # K+V x tokens x heads x head_dim x fp16
NUM_GPU_BLOCKS = 16
NUM_CPU_BLOCKS = 7
REGION_BYTES = NUM_CPU_BLOCKS * WORLD_SIZE * LAYERS * PAGE_BYTES * 2


def make_config(engine_id: str, rank: int = 0, **extra: Any):
    """(vllm_config, kv_cache_config) with the fields the spec reads."""
    cfg = {
        "spec_name": "CxlpoolOffloadingSpec",
        "spec_module_path": "cxlpool.vllm",
        "block_size": 2 * GPU_BLOCK_TOKENS,
        "cpu_bytes_to_use": REGION_BYTES + 5000,  # the remainder holds no block
    }
    cfg.update(extra)
    vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(engine_id=engine_id, kv_connector_extra_config=cfg),
        parallel_config=SimpleNamespace(world_size=WORLD_SIZE, rank=rank),
        cache_config=SimpleNamespace(block_size=GPU_BLOCK_TOKENS),
    )
    kv_cache_config = SimpleNamespace(
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=SimpleNamespace(
            block_size=GPU_BLOCK_TOKENS, page_size_bytes=PAGE_BYTES))],
        kv_cache_tensors=[SimpleNamespace(size=NUM_GPU_BLOCKS * PAGE_BYTES) for _ in range(LAYERS)],
    )
    return vllm_config, kv_cache_config
