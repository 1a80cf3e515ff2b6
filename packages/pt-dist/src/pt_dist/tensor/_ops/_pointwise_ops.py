"""Element-wise ops (torch's ``tensor/_ops/_pointwise_ops.py``; here the arithmetic, the optimizers' and the
activations', the rest of torch's list in ``pt_dist/_compat/tensor/pointwise_ops.py``): the output follows the
first argument sharded on a dim the output keeps (an in-place op follows ``self``); the others are cut to match, a
broadcast dim replicated. A Partial is reduced first, unless the op is linear in it and says so through ``linear``
(torch's ``linear_pointwise_strategy``: ``add`` of Partials, ``mul`` of a Partial by replicated values, ...
registered by ``pt_dist/_compat/tensor/linear_pointwise_ops.py``)."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule, returns_self
from pt_dist.tensor.placement_types import Replicate, Shard

aten = torch.ops.aten

_NAMES = """add add_ sub sub_ rsub mul mul_ div div_ neg neg_ sqrt sqrt_ rsqrt rsqrt_ exp exp_ log log_ pow pow_
reciprocal reciprocal_ addcmul addcmul_ addcdiv addcdiv_ lerp lerp_ where relu relu_ gelu gelu_ gelu_backward
threshold_backward tanh tanh_ tanh_backward sigmoid sigmoid_ sigmoid_backward silu silu_ silu_backward
_to_copy""".split()
POINTWISE_OPS = [getattr(aten, n) for n in _NAMES if hasattr(aten, n)]


@register_prop_rule(POINTWISE_OPS)
def pointwise_rule(call: OpCall, linear=None) -> OutputSharding:
    """``linear(call, mesh_dim)``: (the output's Partial, each argument's placement) when the op keeps a Partial
    on that mesh dim, else None."""
    specs = call.specs
    out_shape = torch.broadcast_shapes(*[s.shape for s in specs])
    nd = len(out_shape)
    inplace = returns_self(call.op)

    def arg_dim(spec, out_dim):  # the argument's dim behind output dim ``out_dim`` (None: absent or broadcast)
        d = out_dim - (nd - spec.ndim)
        return d if d >= 0 and spec.shape[d] == out_shape[out_dim] else None

    wants, out = [[] for _ in specs], []
    for m in range(call.mesh_ndim):
        target = None
        for s in specs[:1] if inplace else specs:
            p = s.placements[m]
            if isinstance(p, Shard) and arg_dim(s, p.dim + nd - s.ndim) is not None:
                target = Shard(p.dim + nd - s.ndim)
                break
            if inplace:
                target = p
        kept = linear(call, m) if linear is not None and not isinstance(target, Shard) else None
        if kept is not None:
            target, wanted = kept
        elif isinstance(target, Shard):
            wanted = [Shard(d) if (d := arg_dim(s, target.dim)) is not None else Replicate() for s in specs]
        elif inplace and target is not None and target.is_partial():
            raise RuntimeError(f"{call.op}: an in-place op on a {target} self is not linear; redistribute self first")
        else:
            target, wanted = Replicate(), [Replicate()] * len(specs)
        for i, w in enumerate(wanted):
            wants[i].append(w)
        out.append(target)
    return OutputSharding([tuple(w) for w in wants], tuple(out))
