"""The element-wise ops that keep a Partial (torch's ``linear_pointwise_strategy`` in
``tensor/_ops/_pointwise_ops.py``): ``add``/``sub`` of Partials (and of replicated DTensors, which each rank then
holds a share of), ``mul``/``div`` of one Partial by replicated values, ``neg`` and casts. The core's pointwise
rule reduces a Partial first (the same values); these give torch's placements, with no collective."""

from __future__ import annotations

import functools

import torch

from pt_dist.tensor._ops._pointwise_ops import pointwise_rule
from pt_dist.tensor._ops.utils import OpCall, register_prop_rule, returns_self
from pt_dist.tensor.placement_types import Partial

aten = torch.ops.aten

_LINEAR_ALL = {"add", "add_", "sub", "sub_"}  # Partials (same reduce op) and replicated DTensors, partitioned
_LINEAR_ONE = {"mul", "mul_", "div", "div_"}  # one Partial argument (div: the numerator), the rest replicated
_LINEAR_UNARY = {"neg", "neg_", "_to_copy"}


def _linear_keeps(call: OpCall, mesh_dim: int) -> bool:
    """Whether the op is linear in its Partial argument(s) on ``mesh_dim``, so the output stays Partial."""
    name = call.op._schema.name.split("::")[-1]
    pls = [s.placements[mesh_dim] for s in call.specs]
    partial = [p for p in pls if p.is_partial()]
    if not partial or any(type(p) is not Partial or p.reduce_op not in ("sum", "avg") for p in partial):
        return False
    if name in _LINEAR_UNARY:
        return len(pls) == 1
    if name in _LINEAR_ALL:  # P + R = P + R/n on every rank (torch's choice: no collective)
        scalar = [a for a in call.args[1:2] if isinstance(a, (int, float, complex))]
        return not scalar and not any(call.plain or ()) and all(p == partial[0] or p.is_replicate() for p in pls)
    if name in _LINEAR_ONE:
        return len(partial) == 1 and (name[:3] != "div" or pls[0].is_partial()) and \
            all(p.is_partial() or p.is_replicate() for p in pls)
    return False


def keep_partial(call: OpCall, mesh_dim: int):
    """(the output's Partial, each argument's placement) when the op is linear in its Partial argument(s) on
    ``mesh_dim``; None otherwise (and for an in-place op on a replicated ``self``: its Partial argument is reduced)."""
    if not _linear_keeps(call, mesh_dim):
        return None
    pls = [s.placements[mesh_dim] for s in call.specs]
    target = pls[0] if returns_self(call.op) else next(p for p in pls if p.is_partial())
    if not target.is_partial():
        return None
    if call.op._schema.name.split("::")[-1] in _LINEAR_ALL:  # add/sub: every argument Partial
        return target, [target] * len(pls)
    return target, pls  # mul/div: the replicated factors stay


_OPS = [getattr(aten, n) for n in sorted(_LINEAR_ALL | _LINEAR_ONE | _LINEAR_UNARY)]
register_prop_rule(_OPS)(functools.partial(pointwise_rule, linear=keep_partial))
