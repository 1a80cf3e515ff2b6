"""Matrix products (torch's ``tensor/_ops/_matrix_ops.py``), per mesh dim, for ``A @ B`` with ``A`` [m, k] and
``B`` [k, n]:

    A          B          out
    Shard(0)   Replicate  Shard(0)     rows of A: rows of the product
    Replicate  Shard(1)   Shard(1)     columns of B: columns of the product
    Shard(1)   Shard(0)   Partial      k split: each rank a term of the sum
    Replicate  Replicate  Replicate
    Partial    Replicate  Partial      (and Replicate @ Partial): linear in the Partial

Inputs laid out otherwise are redistributed to the cheapest of these (``utils.pick``). ``addmm``'s bias follows
the output (a Partial output needs it partitioned). ``bmm`` (``pt_dist/_compat/tensor/matrix_ops.py``) is the same
table one dim further in, plus a batch-sharded row.
"""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, pick, register_prop_rule
from pt_dist.tensor.placement_types import Partial, Replicate, Shard

aten = torch.ops.aten


def _partial_of(*placements) -> Partial:
    for p in placements:
        if type(p) is Partial and p.reduce_op in ("sum", "avg"):
            return p
    return Partial("sum")


def _mm_choices(a, b):
    """(A, B, out) per the table above."""
    r, p = Replicate(), _partial_of(a, b)
    return [(Shard(0), r, Shard(0)), (r, Shard(1), Shard(1)), (Shard(1), Shard(0), p), (r, r, r), (p, r, p),
            (r, p, p)]


def _matmul_rule(call: OpCall, choices=_mm_choices) -> OutputSharding:
    a, b = call.specs[0], call.specs[1]
    wa, wb, out = [], [], []
    for m in range(call.mesh_ndim):
        ca, cb, co = pick([a, b], choices(a.placements[m], b.placements[m]), m)
        wa.append(ca)
        wb.append(cb)
        out.append(co)
    return OutputSharding([tuple(wa), tuple(wb)], tuple(out))


@register_prop_rule([aten.mm])
def mm_rule(call: OpCall) -> OutputSharding:
    return _matmul_rule(call)


def _bias_for(bias, out_placement, out_shape):
    """What ``addmm``'s broadcast bias must be for an output laid out as ``out_placement``."""
    if isinstance(out_placement, Shard):
        d = out_placement.dim - (len(out_shape) - bias.ndim)
        return Shard(d) if d >= 0 and bias.shape[d] == out_shape[out_placement.dim] else Replicate()
    return out_placement


@register_prop_rule([aten.addmm])
def addmm_rule(call: OpCall) -> OutputSharding:
    bias, a, b = call.specs[0], call.specs[1], call.specs[2]
    out_shape = (a.shape[0], b.shape[1])
    wbias, wa, wb, out = [], [], [], []
    for m in range(call.mesh_ndim):
        choices = [(_bias_for(bias, co, out_shape), ca, cb, co)
                   for ca, cb, co in _mm_choices(a.placements[m], b.placements[m])]
        cbias, ca, cb, co = pick([bias, a, b], choices, m)
        wbias.append(cbias)
        wa.append(ca)
        wb.append(cb)
        out.append(co)
    return OutputSharding([tuple(wbias), tuple(wa), tuple(wb)], tuple(out))
