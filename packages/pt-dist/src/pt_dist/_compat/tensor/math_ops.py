"""The reductions beyond ``sum`` (torch's ``tensor/_ops/_math_ops.py``), each the core's ``_reduction`` with the
Partial its per-rank terms make: ``mean`` -> ``Partial("avg")`` when the shards are equal (else the dim is
gathered first), ``amax`` / ``amin`` -> ``Partial("max")`` / ``Partial("min")``, a p-norm -> ``_NormPartial(p)``,
whose reduction is ``(sum x^p)^(1/p)`` (what ``clip_grad_norm_`` over DTensor gradients computes)."""

from __future__ import annotations

import math

import torch

from pt_dist.tensor._ops._math_ops import _reduced_dims, _reduction
from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Partial

aten = torch.ops.aten


class _NormPartial(Partial):
    """Partial p-norms: x^p, all-reduce sum, x^(1/p) (torch's ``_NormPartial``); the inf norms are plain
    ``Partial("max")`` / ``Partial("min")``."""

    __slots__ = ("norm_type",)

    def __init__(self, norm_type: int | float = 2) -> None:
        super().__init__("sum")
        object.__setattr__(self, "norm_type", norm_type)

    def _reduce_value(self, tensor, mesh, mesh_dim):
        return super()._reduce_value(tensor ** self.norm_type, mesh, mesh_dim) ** (1.0 / self.norm_type)

    def _reduce_shard_value(self, tensor, mesh, mesh_dim, shard_spec):
        out = super()._reduce_shard_value(tensor ** self.norm_type, mesh, mesh_dim, shard_spec)
        return out ** (1.0 / self.norm_type)

    def _partition_value(self, tensor, mesh, mesh_dim):
        return tensor / math.pow(mesh.size(mesh_dim), 1 / self.norm_type)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NormPartial) and other.norm_type == self.norm_type

    def __hash__(self) -> int:
        return 1 + hash(self.norm_type)

    def __repr__(self) -> str:
        return f"_NormPartial({self.norm_type})"

    def __str__(self) -> str:
        return f"P(norm{self.norm_type})"

    def __reduce__(self):
        return _NormPartial, (self.norm_type,)


@register_prop_rule([aten.mean])
def mean_rule(call: OpCall) -> OutputSharding:
    reduced = _reduced_dims(call.arg(1, "dim"), call.specs[0].ndim)

    def even(spec, m, p):  # an average of equal shards' means is the mean; of unequal ones it is not
        ways = math.prod(call.mesh.size(i) for i, q in enumerate(spec.placements) if q.is_shard(p.dim))
        return Partial("avg") if spec.shape[p.dim] % ways == 0 else None

    return _reduction(call, reduced, bool(call.arg(2, "keepdim", False)), even, linear=True)


@register_prop_rule([aten.amax, aten.amin])
def minmax_rule(call: OpCall) -> OutputSharding:
    op = "max" if call.op._schema.name == "aten::amax" else "min"
    reduced = _reduced_dims(call.arg(1, "dim"), call.specs[0].ndim)
    return _reduction(call, reduced, bool(call.arg(2, "keepdim", False)), lambda spec, m, p: Partial(op),
                      linear=False)


@register_prop_rule([aten.linalg_vector_norm])
def norm_rule(call: OpCall) -> OutputSharding:
    norm_type = call.arg(1, "ord", 2)
    ord_ = float(norm_type)
    reduced = _reduced_dims(call.arg(2, "dim"), call.specs[0].ndim)

    def partial(spec, m, p):
        if ord_ == math.inf:
            return Partial("max")
        if ord_ == -math.inf:
            return Partial("min")
        return None if ord_ == 0 else _NormPartial(norm_type)

    return _reduction(call, reduced, bool(call.arg(3, "keepdim", False)), partial, linear=False)
