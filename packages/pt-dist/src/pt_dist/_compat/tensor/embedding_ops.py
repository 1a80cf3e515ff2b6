"""``nn.Embedding`` on a sharded table (torch's ``tensor/_ops/_embedding_ops.py`` and ``_MaskPartial`` in
``placement_types.py``). Per mesh dim:

    weight      indices    out
    Shard(1)    Replicate  Shard(last)     columns of the table: columns of every row looked up
    Shard(0)    MaskPartial MaskPartial    rows of the table: each rank looks up the ids in its range
    Replicate   Shard(k)   Shard(k)        ids split: rows of the result

A row-sharded lookup (``RowwiseParallel`` on an embedding) turns the replicated ids into this rank's row numbers,
the ids outside its range masked to row 0 (``_MaskPartial._partition_value``); the rows looked up for masked ids
are zeroed before the sum over ranks (``_reduce_value`` / ``_reduce_shard_value``), so each id's row comes from its
one owner. Backward (``embedding_dense_backward``): a replicated gradient gives every rank the whole table's
gradient (torch's gives a Partial of it: the same sum)."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor._utils import local_shard_size_and_offset
from pt_dist.tensor.placement_types import Partial, Replicate, Shard

aten = torch.ops.aten


class _MaskPartial(Partial):
    """A sum over ranks of lookups each rank made only for the ids in its ``offset_shape[offset_dim]`` range
    (torch's ``_MaskPartial``). The mask of the last ids partitioned is kept until the lookup is reduced."""

    __slots__ = ("offset_shape", "offset_dim", "_mask")

    def __init__(self, offset_shape=None, offset_dim: int = 0) -> None:
        super().__init__("sum")
        object.__setattr__(self, "offset_shape", tuple(offset_shape) if offset_shape is not None else None)
        object.__setattr__(self, "offset_dim", offset_dim)
        object.__setattr__(self, "_mask", [None])

    def _partition_value(self, tensor, mesh, mesh_dim):
        length, start = local_shard_size_and_offset(self.offset_shape[self.offset_dim], mesh.size(mesh_dim),
                                                    mesh.get_coordinate()[mesh_dim])
        outside = (tensor < start) | (tensor >= start + length)
        self._mask[0] = outside
        return (tensor - start).masked_fill(outside, 0)

    def _masked(self, tensor):
        mask = self._mask[0]
        if mask is None:
            raise RuntimeError("_MaskPartial: reducing a lookup whose ids were never partitioned")
        # the ids' dims may have been padded for a reduce-scatter: padded rows are zeros, nothing to mask
        pad = [(0, tensor.size(d) - mask.size(d)) for d in reversed(range(mask.ndim))]
        mask = torch.nn.functional.pad(mask, [x for pair in pad for x in pair]) if any(b for _, b in pad) else mask
        return tensor.masked_fill(mask.reshape(*mask.shape, *([1] * (tensor.ndim - mask.ndim))), 0)

    def _reduce_value(self, tensor, mesh, mesh_dim):
        return super()._reduce_value(self._masked(tensor), mesh, mesh_dim)

    def _reduce_shard_value(self, tensor, mesh, mesh_dim, shard_spec):
        return super()._reduce_shard_value(self._masked(tensor), mesh, mesh_dim, shard_spec)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, _MaskPartial) and other.offset_shape == self.offset_shape
                and other.offset_dim == self.offset_dim)

    def __hash__(self) -> int:
        return 1 + hash((self.offset_shape, self.offset_dim))

    def __repr__(self) -> str:
        return f"_MaskPartial(offset_shape={self.offset_shape}, offset_dim={self.offset_dim})"

    def __str__(self) -> str:
        return "MaskP"

    def __reduce__(self):
        return _MaskPartial, (self.offset_shape, self.offset_dim)


@register_prop_rule([aten.embedding])
def embedding_rule(call: OpCall) -> OutputSharding:
    weight, indices = call.specs[0], call.specs[1]
    ws, ins, out = [], [], []
    for w, i in zip(weight.placements, indices.placements):
        if w == Shard(1) and not i.is_partial():
            choice = (w, Replicate(), Shard(indices.ndim))
        elif w == Shard(0) and i.is_replicate():
            mask = _MaskPartial(weight.shape, 0)
            choice = (w, mask, mask)
        elif isinstance(i, Shard):
            choice = (Replicate(), i, i)
        else:
            choice = (Replicate(), Replicate(), Replicate())
        for lst, p in zip((ws, ins, out), choice):
            lst.append(p)
    return OutputSharding([tuple(ws), tuple(ins)], tuple(out))


@register_prop_rule([aten.embedding_dense_backward])
def embedding_backward_rule(call: OpCall) -> OutputSharding:
    grad, indices = call.specs[0], call.specs[1]
    gs, ins, out = [], [], []
    for g, i in zip(grad.placements, indices.placements):
        if g == Shard(grad.ndim - 1) and i.is_replicate():
            choice = (g, i, Shard(1))  # a column-sharded table's gradient
        elif isinstance(g, Shard) and g == i and g.dim < indices.ndim:
            choice = (g, i, Partial())  # each rank's ids: a term of the table's gradient
        else:
            choice = (Replicate(), Replicate(), Replicate())
        for lst, p in zip((gs, ins, out), choice):
            lst.append(p)
    return OutputSharding([tuple(gs), tuple(ins)], tuple(out))
