"""Ops that copy, create or pack tensors (torch's ``tensor/_ops/_tensor_ops.py``): ``detach``/``clone``/``alias``
keep every placement; ``copy_`` cuts its source to ``self``'s; ``zero_`` keeps ``self``; the ``*_like``
factories follow their input with Partial read as Replicate; ``new_*`` factories make a replicated tensor of the
size asked; ``stack`` / ``cat`` need their inputs laid out alike; ``item()`` reads a replicated value."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Replicate, Shard

aten = torch.ops.aten


@register_prop_rule([aten.detach, aten.clone, aten.alias, aten.lift_fresh, aten.zero_])
def same_placements(call: OpCall) -> OutputSharding:
    return OutputSharding([call.specs[0].placements], call.specs[0].placements)


@register_prop_rule([aten.fill_])
def fill_rule(call: OpCall) -> OutputSharding:
    self = call.specs[0].placements
    if any(p.is_partial() for p in self):
        raise RuntimeError(f"{call.op}: filling a {self} DTensor would fill every rank's term; redistribute it to "
                           "Replicate or Shard first")
    return OutputSharding([self] + [(Replicate(),) * call.mesh_ndim] * (len(call.specs) - 1), self)


@register_prop_rule([aten.copy_])
def copy_rule(call: OpCall) -> OutputSharding:
    dst, src = call.specs[0], call.specs[1]
    wants = []
    for p in dst.placements:
        if isinstance(p, Shard):
            d = p.dim - (dst.ndim - src.ndim)
            wants.append(Shard(d) if d >= 0 and src.shape[d] == dst.shape[p.dim] else Replicate())
        else:
            wants.append(p)  # Replicate, or the same Partial (a replicated source is partitioned)
    return OutputSharding([dst.placements, tuple(wants)], dst.placements)


@register_prop_rule([aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like])
def like_rule(call: OpCall) -> OutputSharding:
    out = tuple(Replicate() if p.is_partial() else p for p in call.specs[0].placements)
    return OutputSharding([None] * len(call.specs), out)


@register_prop_rule([aten.new_empty, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty_strided])
def new_factory_rule(call: OpCall) -> OutputSharding:
    return OutputSharding([None] * len(call.specs), (Replicate(),) * call.mesh_ndim)


@register_prop_rule([aten._local_scalar_dense])
def item_rule(call: OpCall) -> OutputSharding:
    return OutputSharding([(Replicate(),) * call.mesh_ndim], None)


@register_prop_rule([aten.stack, aten.cat])
def stack_cat_rule(call: OpCall) -> OutputSharding:
    """All inputs take the first input's placements; ``cat`` along a sharded dim replicates it; ``stack`` moves
    shard dims at or after the new one up by one."""
    stacking = call.op._schema.name == "aten::stack"
    ndim = call.specs[0].ndim
    dim = call.arg(1, "dim", 0)
    dim = dim % (ndim + 1 if stacking else max(ndim, 1))
    first, ins, out = call.specs[0].placements, [], []
    for m, p in enumerate(first):
        if isinstance(p, Shard) and not stacking and p.dim == dim:
            p = Replicate()
        if p.is_partial() and any(s.placements[m] != p for s in call.specs):
            p = Replicate()
        ins.append(p)
        out.append(Shard(p.dim + 1) if stacking and isinstance(p, Shard) and p.dim >= dim else p)
    return OutputSharding([tuple(ins)] * len(call.specs), tuple(out))

