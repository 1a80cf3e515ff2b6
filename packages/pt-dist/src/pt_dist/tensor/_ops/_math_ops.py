"""Reductions (torch's ``tensor/_ops/_math_ops.py``): reducing over a sharded dim leaves each rank a term, so the
output is Partial (``sum`` -> ``Partial("sum")``, ``amax`` -> ``Partial("max")``, a p-norm -> ``_NormPartial(p)``,
whose reduction is ``(sum x^p)^(1/p)``; ``mean`` -> ``Partial("avg")`` when the shards are equal, else the dim is
gathered first); a shard of a kept dim stays (renumbered); a Partial input stays Partial through ``sum``/``mean``
(linear) and is reduced first for the others."""

from __future__ import annotations

import math

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Partial, Replicate, Shard

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


def _arg(call: OpCall, index: int, name: str, default=None):
    if len(call.args) > index:
        return call.args[index]
    return call.kwargs.get(name, default)


def _reduced_dims(dims, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % max(ndim, 1) for d in dims})


def _reduction(call: OpCall, reduced: list[int], keepdim: bool, partial_of, linear: bool) -> OutputSharding:
    spec = call.specs[0]
    ins, out = [], []
    for m, p in enumerate(spec.placements):
        if isinstance(p, Shard) and p.dim in reduced:
            made = partial_of(spec, m, p)
            if made is None:  # this reduction cannot be split here: gather the dim first
                ins.append(Replicate())
                out.append(Replicate())
            else:
                ins.append(p)
                out.append(made)
        elif isinstance(p, Shard):
            ins.append(p)
            out.append(Shard(p.dim if keepdim else p.dim - sum(d < p.dim for d in reduced)))
        elif p.is_partial() and not (linear and type(p) is Partial and p.reduce_op in ("sum", "avg")):
            ins.append(Replicate())
            out.append(Replicate())
        else:
            ins.append(p)
            out.append(p)
    return OutputSharding([tuple(ins)], tuple(out))


@register_prop_rule([aten.sum])
def sum_rule(call: OpCall) -> OutputSharding:
    reduced = _reduced_dims(_arg(call, 1, "dim"), call.specs[0].ndim)
    return _reduction(call, reduced, bool(_arg(call, 2, "keepdim", False)),
                      lambda spec, m, p: Partial("sum"), linear=True)


@register_prop_rule([aten.mean])
def mean_rule(call: OpCall) -> OutputSharding:
    reduced = _reduced_dims(_arg(call, 1, "dim"), call.specs[0].ndim)

    def even(spec, m, p):  # an average of equal shards' means is the mean; of unequal ones it is not
        ways = math.prod(call.mesh.size(i) for i, q in enumerate(spec.placements) if q.is_shard(p.dim))
        return Partial("avg") if spec.shape[p.dim] % ways == 0 else None

    return _reduction(call, reduced, bool(_arg(call, 2, "keepdim", False)), even, linear=True)


@register_prop_rule([aten.amax, aten.amin])
def minmax_rule(call: OpCall) -> OutputSharding:
    op = "max" if call.op._schema.name == "aten::amax" else "min"
    reduced = _reduced_dims(_arg(call, 1, "dim"), call.specs[0].ndim)
    return _reduction(call, reduced, bool(_arg(call, 2, "keepdim", False)),
                      lambda spec, m, p: Partial(op), linear=False)


@register_prop_rule([aten.linalg_vector_norm])
def norm_rule(call: OpCall) -> OutputSharding:
    norm_type = _arg(call, 1, "ord", 2)
    ord_ = float(norm_type)
    reduced = _reduced_dims(_arg(call, 2, "dim"), call.specs[0].ndim)

    def partial(spec, m, p):
        if ord_ == math.inf:
            return Partial("max")
        if ord_ == -math.inf:
            return Partial("min")
        return None if ord_ == 0 else _NormPartial(norm_type)

    return _reduction(call, reduced, bool(_arg(call, 3, "keepdim", False)), partial, linear=False)
