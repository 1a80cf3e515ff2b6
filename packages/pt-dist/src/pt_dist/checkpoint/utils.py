"""Small helpers torch keeps in checkpoint/utils.py: find a value by ``MetadataIndex``, narrow a tensor to a
box, and ``_DistWrapper``, the group a save and a load coordinate over."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist._infra import collective_steps
from pt_dist.object_collectives import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from pt_dist.tensor._api import DTensor

from .metadata import MetadataIndex

T = TypeVar("T")
R = TypeVar("R")


def narrow_tensor_by_index(tensor: torch.Tensor, offsets: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    out = tensor
    for dim, (offset, size) in enumerate(zip(offsets, sizes)):
        if size < tensor.size(dim):
            out = out.narrow(dim, offset, size)
    return out


def find_state_dict_object(state_dict: dict, index: MetadataIndex) -> Any:
    """The value at ``index.fqn``; for a DTensor, its local tensor (the chunk an index's offset names)."""
    if index.fqn not in state_dict:
        raise ValueError(f"Could not find FQN: '{index.fqn}'")
    obj = state_dict[index.fqn]
    if isinstance(obj, DTensor):
        return obj.to_local()
    if isinstance(obj, torch.Tensor):
        if index.offset is not None and any(index.offset):
            raise ValueError(f"FQN: '{index.fqn}' is a plain tensor: it has no chunk at offset {list(index.offset)}")
        return obj
    if index.offset is not None:
        raise ValueError(f"FQN: '{index.fqn}' is not a tensor, can't find by offset: '{index.offset}'")
    return obj


def find_tensor_shard(tensor: torch.Tensor, index: MetadataIndex) -> torch.Tensor:
    """The part of ``tensor`` this rank holds for ``index`` (a DTensor's local tensor; a plain tensor at offset 0)."""
    if isinstance(tensor, DTensor):
        return tensor.to_local()
    if index.offset is not None and any(index.offset):
        raise ValueError(f"FQN: '{index.fqn}' is not a ShardedTensor, can't find by offset: '{index.offset}'")
    return tensor


class _DistWrapper:
    """One pt_dist group (or one process, ``use_dist=False``) with the coordinator's rank in it: torch's object
    collectives over it, and the save's and load's collective steps (``pt_dist/_infra/collective_steps.py``:
    each rank's part run in a try, any rank's failure raised on every rank)."""

    def __init__(self, group, use_dist: bool, coordinator_rank: int = 0):
        self.use_dist = use_dist
        self.group = (group or c10d.group.WORLD) if use_dist else None
        self.rank = self.group.rank() if use_dist else 0
        self.world_size = self.group.size() if use_dist else 1
        self.coordinator_rank = coordinator_rank
        self.is_coordinator = self.rank == coordinator_rank

    def _coordinator(self) -> int:
        return c10d.get_global_rank(self.group, self.coordinator_rank)

    def gather_object(self, obj):
        if not self.use_dist:
            return [obj]
        out = [None] * self.world_size if self.is_coordinator else None
        gather_object(obj, out, dst=self._coordinator(), group=self.group)
        return out

    def scatter_object(self, objects):
        if not self.use_dist:
            return objects[0]
        out = [None]
        scatter_object_list(out, objects if self.is_coordinator else None, src=self._coordinator(), group=self.group)
        return out[0]

    def broadcast_object(self, obj):
        if not self.use_dist:
            return obj
        box = [obj if self.is_coordinator else None]
        broadcast_object_list(box, src=self._coordinator(), group=self.group)
        return box[0]

    def all_gather_object(self, obj) -> list:
        if not self.use_dist:
            return [obj]
        out = [None] * self.world_size
        all_gather_object(out, obj, group=self.group)
        return out

    def reduce_scatter(self, step: str, map_fun: Callable[[], T], reduce_fun: Callable[[list[T]], list[R]]) -> R:
        """Each rank maps, the coordinator reduces the list, each rank gets its element back."""
        return collective_steps.reduce_scatter(self, step, map_fun, reduce_fun)

    def all_reduce(self, step: str, map_fun: Callable[[], T], reduce_fun: Callable[[list[T]], R]) -> R:
        """Each rank maps, the coordinator reduces, every rank gets the reduction."""
        return collective_steps.all_reduce(self, step, map_fun, reduce_fun)

    def all_gather(self, step: str, map_fun: Callable[[], T]) -> list[T]:
        return collective_steps.all_gather(self, step, map_fun)
