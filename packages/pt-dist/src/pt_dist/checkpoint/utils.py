"""Small helpers torch keeps in checkpoint/utils.py: find a value by ``MetadataIndex``, narrow a tensor to a
box, and ``_DistWrapper``, the object collectives a save and a load coordinate with (here over pt_dist's
groups: ``gather_object``, ``scatter_object_list``, ``broadcast_object_list``, ``all_gather_object``).

Every step runs inside a try: a rank that fails sends its exception instead of its result, so all ranks raise
the same ``CheckpointException`` (naming each failed rank and its error) instead of some hanging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from .api import CheckpointException, _wrap_exception
from .metadata import MetadataIndex
from .planner_helpers import _is_dtensor

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
    if _is_dtensor(obj):
        return obj.to_local()
    if isinstance(obj, torch.Tensor):
        if index.offset is not None and any(index.offset):
            raise ValueError(f"FQN: '{index.fqn}' is a plain tensor: it has no chunk at offset {list(index.offset)}")
        return obj
    if index.offset is not None:
        raise ValueError(f"FQN: '{index.fqn}' is not a tensor, can't find by offset: '{index.offset}'")
    return obj


class _DistWrapper:
    """Collectives with error propagation over one pt_dist group (or none: one process, ``use_dist=False``)."""

    def __init__(self, group, use_dist: bool, coordinator_rank: int = 0):
        from pt_dist import distributed_c10d as c10d

        self.use_dist = use_dist
        self.group = (group or c10d.group.WORLD) if use_dist else None
        self.rank = self.group.rank() if use_dist else 0
        self.world_size = self.group.size() if use_dist else 1
        self.coordinator_rank = coordinator_rank
        self.is_coordinator = self.rank == coordinator_rank

    def _global(self, group_rank: int) -> int:
        from pt_dist import distributed_c10d as c10d

        return c10d.get_global_rank(self.group, group_rank)

    def gather_object(self, obj):
        if not self.use_dist:
            return [obj]
        from pt_dist.object_collectives import gather_object

        out = [None] * self.world_size if self.is_coordinator else None
        gather_object(obj, out, dst=self._global(self.coordinator_rank), group=self.group)
        return out

    def scatter_object(self, objects):
        if not self.use_dist:
            return objects[0]
        from pt_dist.object_collectives import scatter_object_list

        out = [None]
        scatter_object_list(out, objects if self.is_coordinator else None,
                            src=self._global(self.coordinator_rank), group=self.group)
        return out[0]

    def broadcast_object(self, obj):
        if not self.use_dist:
            return obj
        from pt_dist.object_collectives import broadcast_object_list

        box = [obj if self.is_coordinator else None]
        broadcast_object_list(box, src=self._global(self.coordinator_rank), group=self.group)
        return box[0]

    def all_gather_object(self, obj) -> list:
        if not self.use_dist:
            return [obj]
        from pt_dist.object_collectives import all_gather_object

        out = [None] * self.world_size
        all_gather_object(out, obj, group=self.group)
        return out

    def reduce_scatter(self, step: str, map_fun: Callable[[], T], reduce_fun: Callable[[list[T]], list[R]]) -> R:
        """Each rank maps, the coordinator reduces the list, each rank gets its element back."""
        local = _attempt(map_fun)
        results = None
        gathered = self.gather_object(local)
        if self.is_coordinator:
            failures = _failures(gathered)
            if not failures:
                reduced = _attempt(lambda: reduce_fun(gathered))
                if isinstance(reduced, _Failed):
                    failures = {self.rank: reduced.wrapped}
            results = ([CheckpointException(step, failures)] * self.world_size if failures else reduced)
        result = self.scatter_object(results)
        if isinstance(result, CheckpointException):
            raise result
        return result

    def all_reduce(self, step: str, map_fun: Callable[[], T], reduce_fun: Callable[[list[T]], R]) -> R:
        """Each rank maps, the coordinator reduces, every rank gets the reduction."""
        local = _attempt(map_fun)
        gathered = self.gather_object(local)
        result = None
        if self.is_coordinator:
            failures = _failures(gathered)
            if not failures:
                reduced = _attempt(lambda: reduce_fun(gathered))
                failures = {self.rank: reduced.wrapped} if isinstance(reduced, _Failed) else {}
            result = CheckpointException(step, failures) if failures else reduced
        result = self.broadcast_object(result)
        if isinstance(result, CheckpointException):
            raise result
        return result

    def all_gather(self, step: str, map_fun: Callable[[], T]) -> list[T]:
        gathered = self.all_gather_object(_attempt(map_fun))
        failures = _failures(gathered)
        if failures:
            raise CheckpointException(step, failures)
        return gathered


class _Failed:
    """A step's exception in picklable form (the exception, or its text if it does not pickle)."""

    def __init__(self, wrapped):
        self.wrapped = wrapped


def _attempt(fun):
    try:
        return fun()
    except Exception as e:  # (sent to the coordinator: every rank raises it)
        return _Failed(_wrap_exception(e))


def _failures(results: list) -> dict:
    return {rank: r.wrapped for rank, r in enumerate(results) if isinstance(r, _Failed)}

