"""``torch._foreach_*`` on lists of DTensors (torch's ``list_pointwise_strategy`` in ``tensor/_ops/_pointwise_ops.py``):
what ``foreach=True`` optimizers call. Element ``j`` of every list is one element-wise op, laid out as the first
list's element ``j`` (a Partial read as Replicate); the others are cut or reduced to match, and the outputs follow.
The reductions among them (``_foreach_norm``, ``_foreach_max``) have no rule here."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Replicate

aten = torch.ops.aten


_NAMES = sorted({n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                 if n.startswith("aten::_foreach_")} - {"_foreach_norm", "_foreach_max"})


@register_prop_rule([getattr(aten, n) for n in _NAMES])
def foreach_rule(call: OpCall) -> OutputSharding:
    element, lead = [], None  # per spec: its index in its list (None: not in a list); the first list's specs
    i = 0
    for a in (*call.args, *call.kwargs.values()):
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            element.extend(range(len(a)))
            if lead is None:
                lead = call.specs[i:i + len(a)]
            i += len(a)
        elif isinstance(a, torch.Tensor):
            element.append(None)
            i += 1
    if call.op._schema.name.endswith("_") and any(p.is_partial() for s in lead for p in s.placements):
        raise RuntimeError(f"{call.op}: an in-place op on a Partial self is not element-wise; redistribute it first")
    layouts = [tuple(Replicate() if p.is_partial() else p for p in s.placements) for s in lead]
    wants = [layouts[j] if j is not None else None for j in element]
    return OutputSharding(wants, layouts)
