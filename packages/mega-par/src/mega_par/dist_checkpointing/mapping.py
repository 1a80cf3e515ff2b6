"""``ShardedTensor``: a local tensor plus where it sits in the global one (``megatron/core/dist_checkpointing/
mapping.py``).

A checkpoint stores global tensors under layout-free keys (``decoder.layers.mlp.linear_fc1.weight`` with the
layer index as a prepended axis). Each rank describes its piece by ``global_offset`` / ``global_shape``, so a
load into another TP/PP layout asks for other offsets of the same global tensor. ``replica_id`` marks copies:
only the main replica (0, or all zeros) is written. ``ShardedTensorFactory`` turns one local tensor into several
sharded ones and back (the SwiGLU ``[gate; up]`` weight, whose TP shard is two slices).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from mega_par.dist_checkpointing.core import CheckpointingException

ReplicaId = int | tuple[int, ...]


@dataclass
class ShardedTensor:
    """Megatron's ``ShardedTensor`` (fields and order as upstream; ``flattened_range`` only ``None``)."""

    key: str
    data: torch.Tensor | None
    dtype: torch.dtype
    local_shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    axis_fragmentations: tuple[int, ...] | None
    replica_id: ReplicaId = 0
    prepend_axis_num: int = 0
    allow_shape_mismatch: bool = False
    flattened_range: slice | None = None

    def __post_init__(self):
        if self.flattened_range is not None:
            raise CheckpointingException(f"{self.key}: flattened_range={self.flattened_range} is not supported")
        ndim = len(self.local_shape) + self.prepend_axis_num
        if len(self.global_shape) != ndim or len(self.global_offset) != ndim:
            raise CheckpointingException(
                f"{self.key}: global_shape {self.global_shape} and global_offset {self.global_offset} need "
                f"{ndim} axes (local_shape {self.local_shape} + {self.prepend_axis_num} prepended)")
        if self.data is not None and tuple(self.data.shape) != tuple(self.local_shape):
            raise CheckpointingException(f"{self.key}: data shape {tuple(self.data.shape)} != local_shape "
                                         f"{self.local_shape}")
        for off, size, full in zip(self.global_offset, self.stored_shape, self.global_shape):
            if off < 0 or off + size > full:
                raise CheckpointingException(f"{self.key}: shard at offset {self.global_offset} of shape "
                                             f"{self.stored_shape} lies outside global shape {self.global_shape}")

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The local shape with the prepended axes (each of size 1), as the shard is written."""
        return (1,) * self.prepend_axis_num + tuple(self.local_shape)

    @classmethod
    def from_rank_offsets(cls, key: str, data: torch.Tensor, *rank_offsets: tuple[int, int, int],
                          replica_id: ReplicaId = 0, prepend_axis_num: int = 0, flattened_range: None = None,
                          **init_kwargs) -> ShardedTensor:
        """Each ``(axis, axis_rank_offset, axis_fragm)``: along ``axis`` the global tensor is ``axis_fragm`` equal
        chunks and ``data`` is chunk ``axis_rank_offset`` (axes count the prepended ones first)."""
        ndim = data.ndim + prepend_axis_num
        global_shape = [1] * prepend_axis_num + list(data.shape)
        global_offset, fragments = [0] * ndim, [1] * ndim
        for axis, rank_offset, fragm in rank_offsets:
            if not 0 <= axis < ndim or fragm < 1 or not 0 <= rank_offset < fragm:
                raise CheckpointingException(f"Invalid rank offsets: {rank_offsets} for key {key}.")
            size = 1 if axis < prepend_axis_num else data.shape[axis - prepend_axis_num]
            global_shape[axis], global_offset[axis], fragments[axis] = fragm * size, rank_offset * size, fragm
        return cls(key, data, data.dtype, tuple(data.shape), tuple(global_shape), tuple(global_offset),
                   tuple(fragments), replica_id, prepend_axis_num, flattened_range=flattened_range, **init_kwargs)

    def without_data(self) -> ShardedTensor:
        return replace(self, data=None)

    def numel(self) -> int:
        return math.prod(self.local_shape)


@dataclass
class ShardedTensorFactory:
    """Megatron's ``ShardedTensorFactory``: ``build_fn(key, data, replica_id, flattened_range)`` -> a dict of
    ShardedTensors to save; ``merge_fn(loaded sub-dict)`` -> the one local tensor again."""

    key: str
    data: torch.Tensor
    build_fn: Callable
    merge_fn: Callable
    replica_id: ReplicaId = 0
    flattened_range: slice | None = None

    def build(self) -> dict:
        return self.build_fn(self.key, self.data, self.replica_id, self.flattened_range)


def is_main_replica(replica_id: ReplicaId) -> bool:
    """0, or a tuple of zeros: the one copy among identical shards that is written."""
    if isinstance(replica_id, int):
        return replica_id == 0
    return all(r == 0 for r in replica_id)
