"""Type stubs of cxlpool.torch."""

from typing import Any, Iterable, Sequence

import torch

from . import Client, Lease

def set_client(client: Client | None) -> None: ...
def get_client() -> Client: ...
def empty(
    *shape: Any,
    dtype: torch.dtype | None = None,
    near_gpu: int | str | torch.device | None = None,
    tier: str | Sequence[str] | None = None,
    name: str | None = None,
    numa_node: int | None = None,
    gpu: str | None = None,
    strict: bool = False,
    hugetlb: bool = False,
    register: bool | None = None,
    label: str = "torch",
    acl_uids: Iterable[int] | None = None,
    acl_gids: Iterable[int] | None = None,
    client: Client | None = None,
    long_term_pin: bool | None = None,
) -> torch.Tensor: ...
def zeros(*shape: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor: ...
def ones(*shape: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor: ...
def full(shape: Sequence[int], fill_value: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor: ...
def empty_like(t: torch.Tensor, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor: ...
def zeros_like(t: torch.Tensor, dtype: torch.dtype | None = None, **kwargs: Any) -> torch.Tensor: ...
def pin(t: torch.Tensor, **kwargs: Any) -> torch.Tensor: ...
def attach(
    name: str,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype = ...,
    near_gpu: int | str | torch.device | None = None,
    register: bool | None = None,
    client: Client | None = None,
    owner_uid: int | None = None,
) -> torch.Tensor: ...
def lease_of(t: torch.Tensor) -> Lease | None: ...
def use_as_pinned_allocator(
    small_max: int = 1048576, slab_bytes: int = 2097152, socket: str | None = None, priority: int = 100
) -> None: ...
def pinned_allocator_installed() -> bool: ...
def pinned_allocator_stats() -> dict[str, int]: ...
