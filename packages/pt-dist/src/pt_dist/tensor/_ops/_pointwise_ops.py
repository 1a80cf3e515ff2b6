"""Element-wise ops (torch's ``tensor/_ops/_pointwise_ops.py``): the output follows the first argument sharded on
a dim the output keeps (an in-place op follows ``self``); the others are cut to match, a broadcast dim replicated.
A Partial survives only where the op is linear in it: ``add``/``sub`` of Partials, ``mul``/``div`` of one Partial
by replicated values, ``neg`` and casts; anywhere else the Partial is reduced first."""

from __future__ import annotations

import torch

from pt_dist.tensor._ops.utils import OpCall, OutputSharding, register_prop_rule
from pt_dist.tensor.placement_types import Partial, Replicate, Shard

aten = torch.ops.aten

_NAMES = """abs abs_ add add_ sub sub_ rsub mul mul_ div div_ neg neg_ sqrt sqrt_ rsqrt rsqrt_ exp exp_ log log_ log1p
expm1 pow pow_ reciprocal reciprocal_ sign sgn clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ maximum minimum
where lerp lerp_ addcmul addcmul_ addcdiv addcdiv_ relu relu_ gelu gelu_ gelu_backward threshold_backward tanh tanh_
tanh_backward sigmoid sigmoid_ sigmoid_backward silu silu_ silu_backward sin cos erf floor ceil round trunc frac
eq ne gt lt ge le eq_ ne_ gt_ lt_ ge_ le_ isnan isinf isfinite logical_not logical_and logical_or masked_fill
masked_fill_ nan_to_num nan_to_num_ square bitwise_and bitwise_or bitwise_not hardtanh hardtanh_ leaky_relu
leaky_relu_ softplus _to_copy""".split()

POINTWISE_OPS = [getattr(aten, n) for n in _NAMES if hasattr(aten, n)]
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


def _returns_self(op) -> bool:
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and rets[0].alias_info.is_write


@register_prop_rule(POINTWISE_OPS)
def pointwise_rule(call: OpCall) -> OutputSharding:
    specs = call.specs
    out_shape = torch.broadcast_shapes(*[s.shape for s in specs])
    nd = len(out_shape)
    inplace = _returns_self(call.op)

    def arg_dim(spec, out_dim):  # the argument's dim behind output dim ``out_dim`` (None: absent or broadcast)
        d = out_dim - (nd - spec.ndim)
        return d if d >= 0 and spec.shape[d] == out_shape[out_dim] else None

    wants = [[] for _ in specs]
    out = []
    for m in range(call.mesh_ndim):
        target = None
        for s in specs[:1] if inplace else specs:
            p = s.placements[m]
            if isinstance(p, Shard) and arg_dim(s, p.dim + nd - s.ndim) is not None:
                target = Shard(p.dim + nd - s.ndim)
                break
            if inplace:
                target = p
        keep_partial = _linear_keeps(call, m)
        if target is None or (target.is_partial() and not keep_partial):
            if inplace and target is not None:
                raise RuntimeError(f"{call.op}: an in-place op on a {target} self is not linear; redistribute self "
                                   "first")
            target = next((s.placements[m] for s in specs if s.placements[m].is_partial()), None) \
                if keep_partial else Replicate()
        for i, s in enumerate(specs):
            if isinstance(target, Shard):
                d = arg_dim(s, target.dim)
                wants[i].append(Shard(d) if d is not None else Replicate())
            elif target.is_partial():  # add/sub: all Partial; mul/div: the replicated factors stay
                name = call.op._schema.name.split("::")[-1]
                wants[i].append(target if name in _LINEAR_ALL else s.placements[m])
            else:
                wants[i].append(Replicate())
        out.append(target)
    return OutputSharding([tuple(w) for w in wants], tuple(out))
