"""Shard arithmetic (torch's ``torch/distributed/tensor/_utils.py`` and ``Shard.local_shard_size_and_offset``):
a dim of size ``n`` over ``k`` ranks is cut as ``torch.chunk`` cuts it, chunks of ``ceil(n / k)`` with the last
ranks short or empty; an empty shard's offset is ``n``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pt_dist.tensor.placement_types import Placement, Shard

__all__ = ["compute_local_shape_and_global_offset", "compute_global_tensor_info", "local_shard_size_and_offset"]


local_shard_size_and_offset = Shard.local_shard_size_and_offset


def compute_local_shape_and_global_offset(global_shape: Sequence[int], mesh, placements: Sequence[Placement],
                                          skip_offset: bool = False) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """This rank's local shape and where it starts in the global tensor (for checkpoints: torch's function of the
    same name). Shards nest left to right: mesh dim 0 cuts first, the next one cuts what dim 0 left."""
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return (0,), ()
    return _local_shape_and_offset(global_shape, mesh.shape, coordinate, placements, skip_offset)


def _local_shape_and_offset(global_shape, mesh_shape, coordinate, placements, skip_offset=False):
    """The same on plain data (a mesh shape and a coordinate), for tests and for other ranks' shards."""
    if len(placements) != len(mesh_shape):
        raise ValueError(f"placements {tuple(placements)} need one entry per mesh dim of mesh shape "
                         f"{tuple(mesh_shape)}")
    local = list(global_shape)
    offset = [0] * len(local)
    for mesh_dim, p in enumerate(placements):
        if not isinstance(p, Shard):
            continue
        if not 0 <= p.dim < len(local):
            raise ValueError(f"{p!r} is out of range for a tensor of {len(local)} dims (shape {tuple(global_shape)})")
        length, start = local_shard_size_and_offset(local[p.dim], mesh_shape[mesh_dim], coordinate[mesh_dim])
        # an empty shard sits at the global end of the dim, as torch's
        offset[p.dim] = global_shape[p.dim] if length == 0 else offset[p.dim] + start
        local[p.dim] = length
    return tuple(local), (() if skip_offset else tuple(offset))


def compute_global_tensor_info(tensor: torch.Tensor, mesh, placements: Sequence[Placement]
                               ) -> tuple[list[int], list[int]]:
    """Global shape and stride from a local tensor, assuming every rank holds an equal shard (torch's, used by
    ``from_local`` without ``shape``/``stride``)."""
    shape = list(tensor.shape)
    stride = list(tensor.stride())
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):  # (p.dim in range: the placements are normalised)
            n = mesh.size(mesh_dim)
            shard_stride = stride[p.dim]
            shape[p.dim] *= n
            # every dim laid out outside the sharded one grows by the mesh size
            stride = [s * n if s >= shard_stride and i != p.dim else s for i, s in enumerate(stride)]
    return shape, stride


def contiguous_like_stride(shape: Sequence[int], local_stride: Sequence[int]) -> tuple[int, ...]:
    """Strides of ``shape`` laid out in the dim order of ``local_stride`` (a transposed shard is a transposed
    global tensor)."""
    order = sorted(range(len(shape)), key=lambda i: (-local_stride[i], i))
    stride = [0] * len(shape)
    step = 1
    for i in reversed(order):
        stride[i] = step
        step *= max(shape[i], 1)
    return tuple(stride)


def pad_dim(tensor: torch.Tensor, dim: int, pad: int) -> torch.Tensor:
    """``tensor`` with ``pad`` zeros appended along ``dim``."""
    if pad <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = pad
    return torch.cat([tensor, tensor.new_zeros(shape)], dim)


def normalize_placements(placements: Sequence[Placement], ndim: int, mesh_ndim: int, what: str) -> tuple:
    """Negative Shard dims made positive; length and range checked, naming the bad value."""
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(f"{what}: `placements` must have the same length as `device_mesh.ndim`! Found placements "
                         f"length: {len(placements)}, and device_mesh.ndim: {mesh_ndim}.")
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"{what}: {p!r} is not a Placement (Shard, Replicate or Partial)")
        if isinstance(p, Shard):
            if not -ndim <= p.dim < ndim:
                raise IndexError(f"{what}: {p!r} is out of range for a tensor of {ndim} dims")
            p = Shard(p.dim % ndim) if p.dim < 0 else p
        out.append(p)
    partial_ops = {p.reduce_op for p in out if p.is_partial()}
    if len(partial_ops) > 1 and partial_ops != {"sum", "avg"}:  # sum and avg commute, as torch allows
        raise ValueError(f"{what}: mixed Partial reduce types in {tuple(out)} are not supported")
    return tuple(out)
