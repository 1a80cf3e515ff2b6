"""Reductions (torch's ``tensor/_ops/_math_ops.py``): reducing over a sharded dim leaves each rank a term of the
result, so the output is Partial (``sum`` -> ``Partial("sum")``); a shard of a kept dim stays (renumbered); a
Partial input stays Partial through a linear reduction and is reduced first for the others. ``_reduction`` is the
rule every reduction shares: each one only says which Partial its per-rank terms make (``mean``, ``amax``,
``amin`` and the vector norms in ``pt_dist/_compat/tensor/math_ops.py``)."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Partial, Replicate, Shard

aten = torch.ops.aten


def _reduced_dims(dims, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % max(ndim, 1) for d in dims})


def _reduction(call: OpCall, reduced: list[int], keepdim: bool, partial_of, linear: bool) -> OutputSharding:
    """Per mesh dim: a shard of a reduced dim becomes ``partial_of(spec, mesh_dim, shard)`` (None: this reduction
    cannot be split, gather the dim first); a shard of a kept dim is renumbered; a Partial input stays only through
    a ``linear`` reduction of a sum/avg."""
    spec = call.specs[0]
    ins, out = [], []
    for m, p in enumerate(spec.placements):
        if isinstance(p, Shard) and p.dim in reduced:
            made = partial_of(spec, m, p)
            ins.append(p if made is not None else Replicate())
            out.append(made if made is not None else Replicate())
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
    reduced = _reduced_dims(call.arg(1, "dim"), call.specs[0].ndim)
    return _reduction(call, reduced, bool(call.arg(2, "keepdim", False)), lambda spec, m, p: Partial("sum"),
                      linear=True)
