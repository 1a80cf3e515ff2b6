"""One aten op on DTensors (torch's ``tensor/_dispatch.py`` ``OpDispatcher.dispatch`` with
``_sharding_prop.py``): unwrap -> ask the op's sharding rule (``_ops/``) -> redistribute the arguments it asks
for -> run the op on the local tensors -> wrap the local results with the rule's output placements and the
global shape the op gives on meta tensors.

The rule's answer and the global output shapes depend only on the op, the arguments' global shapes, placements
and the non-tensor values, so they are computed once per such key and cached (torch's sharding-propagation
cache). An op without a rule raises ``NotImplementedError`` naming it: nothing is gathered behind the caller's
back. A plain tensor argument is refused unless it holds one element (then it is a replicated scalar, as torch's)
or ``allow_implicit_replication`` is set (then any is, as torch's under ``implicit_replication()``).

``DTensor.__torch_dispatch__`` passes its class in, so this module needs no import of ``_api.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._ops.utils import OpCall, returns_self, rule_for
from pt_dist.tensor._redistribute import redistribute_local_tensor
from pt_dist.tensor.placement_types import Replicate

__all__ = ["dispatch"]

_CACHE: dict = {}
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _flatten(args: tuple, kwargs: dict):
    """The arguments as one flat list (a list of tensors, as ``cat``'s, opened one level) and how to rebuild them."""
    flat, shape = [], []
    for a in (*args, *kwargs.values()):
        opened = type(a) in (list, tuple) and a and isinstance(a[0], torch.Tensor)
        shape.append((type(a), len(a)) if opened else None)
        flat.extend(a if opened else (a,))
    return flat, (len(args), tuple(kwargs), tuple(shape))


def _unflatten(flat: list, tree) -> tuple[tuple, dict]:
    nargs, keys, shape = tree
    out, i = [], 0
    for s in shape:
        out.append(flat[i] if s is None else s[0](flat[i:i + s[1]]))
        i += 1 if s is None else s[1]
    return tuple(out[:nargs]), dict(zip(keys, out[nargs:]))


allow_implicit_replication = False  # any plain tensor taken as Replicate (torch's experimental.implicit_replication)


def _key(x, dtensor):
    if isinstance(x, dtensor):
        return ("D", x._spec.tensor_meta, x._spec.placements)
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, _SCALARS):
        return (type(x), x)
    if isinstance(x, (list, tuple)) and all(isinstance(e, _SCALARS) for e in x):
        return (type(x), tuple(x))
    return None  # not hashable as a value: decided afresh each call


@dataclass
class _Decision:
    """What the cache keeps per key: the rule's answer, where the tensor arguments are in the flat list, and the
    global output metas (filled by the first call that has a tensor output). No specs: they would hold this
    call's mesh (and its groups)."""

    sharding: object  # the rule's OutputSharding
    positions: list[int]
    metas: list | None = None


def _global_meta(op, flat, tree, dtensor) -> list:
    """The op's output(s) on meta tensors of the global shapes: global shape, stride and dtype of each output."""
    # a plain 0-d tensor stays as it is (a CPU scalar meets meta tensors); every other tensor becomes meta
    metas = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
             if isinstance(x, dtensor) or (isinstance(x, torch.Tensor) and x.ndim > 0) else x for x in flat]
    margs, mkwargs = _unflatten(metas, tree)
    out = op(*margs, **mkwargs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return [TensorMeta(o.shape, tuple(o.stride()), o.dtype) if isinstance(o, torch.Tensor) else None for o in outs]


def _decide(op, args, kwargs, flat, mesh, dtensor) -> _Decision:
    """Ask the op's rule, given every tensor argument's spec (a plain one-element tensor as a Replicate one)."""
    specs, positions = [], []
    for i, x in enumerate(flat):
        if isinstance(x, dtensor):
            if x.device_mesh != mesh:
                raise NotImplementedError(f"{op}: DTensor arguments on different meshes ({mesh} and "
                                          f"{x.device_mesh})")
            specs.append(x._spec)
            positions.append(i)
        elif isinstance(x, torch.Tensor):
            if x.numel() != 1 and not allow_implicit_replication:
                raise RuntimeError(f"{op}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
                                   "DTensor before calling distributed operators!")
            specs.append(DTensorSpec(mesh, (Replicate(),) * mesh.ndim,
                                     TensorMeta(x.shape, tuple(x.stride()), x.dtype)))
            positions.append(i)
    plain = [not isinstance(flat[pos], dtensor) for pos in positions]
    sharding = rule_for(op)(OpCall(op, args, kwargs, specs, mesh, plain))
    if sharding.local_args is not None:  # cached: keep the rewritten values, not this call's tensors
        lflat, ltree = _flatten(sharding.local_args, sharding.local_kwargs or {})
        sharding.local_args, sharding.local_kwargs = _unflatten(
            [None if isinstance(x, torch.Tensor) else x for x in lflat], ltree)
    return _Decision(sharding, positions)


def dispatch(dtensor: type, op, args, kwargs):
    """``op(*args, **kwargs)`` where some arguments are instances of ``dtensor`` (the DTensor class)."""
    flat, tree = _flatten(args, kwargs)
    mesh = next(x for x in flat if isinstance(x, dtensor)).device_mesh
    keys = tuple(_key(x, dtensor) for x in flat)
    # this rank's coordinate too: a view's local size depends on it, and a process may join another world later
    key = (op, mesh, mesh._coordinate_on_dim, tree, keys, allow_implicit_replication) if None not in keys else None
    decision = _CACHE.get(key) if key is not None else None
    if decision is None:
        decision = _decide(op, args, kwargs, flat, mesh, dtensor)
        if key is not None:
            _CACHE[key] = decision
    sharding = decision.sharding

    # 1. redistribute the DTensor arguments to the placements the rule asks for; run the op on the local tensors
    local_flat = list(flat)
    for pos, want in zip(decision.positions, sharding.input_placements):
        x = flat[pos]
        if isinstance(x, dtensor):
            spec, local = x._spec, x._local_tensor  # this call's (a cached spec's mesh may be an older world's)
        elif want is None or all(isinstance(p, Replicate) for p in want):
            continue
        else:  # a plain tensor under implicit replication, cut to the placements asked for
            spec, local = DTensorSpec(mesh, (Replicate(),) * mesh.ndim, TensorMeta(x.shape, x.stride(), x.dtype)), x
        if want is not None and want != spec.placements:
            if pos == 0 and returns_self(op):
                raise RuntimeError(f"{op}: the in-place op would change self's placements {spec.placements} to "
                                   f"{tuple(want)}; redistribute self first")
            local = redistribute_local_tensor(local, spec, DTensorSpec(mesh, tuple(want), spec.tensor_meta))
        local_flat[pos] = local
    if sharding.local_args is not None:  # the rule rewrote a non-tensor argument (a view's size) for the local op
        new_flat, new_tree = _flatten(sharding.local_args, sharding.local_kwargs or {})
        if new_tree != tree:
            raise AssertionError(f"{op}: a rule's local arguments must keep the arguments' structure")
        local_flat = [lf if isinstance(x, torch.Tensor) else nf for x, lf, nf in zip(flat, local_flat, new_flat)]
    largs, lkwargs = _unflatten(local_flat, tree)
    out = op(*largs, **lkwargs)

    # 2. wrap the local results with the rule's output placements and the op's global shapes
    if returns_self(op) and isinstance(flat[0], dtensor):
        return flat[0]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if not any(isinstance(o, torch.Tensor) for o in outs):
        return out  # a Python value (item(), a size): nothing to wrap, no meta run
    if decision.metas is None:
        decision.metas = _global_meta(op, flat, tree, dtensor)
    placements = sharding.output_placements
    per_output = placements if isinstance(placements, list) else [placements] * len(outs)
    wrapped = []
    for o, meta, p in zip(outs, decision.metas, per_output):
        if isinstance(o, torch.Tensor):
            if p is None:
                raise NotImplementedError(f"{op}: its sharding rule gave no placement for an output")
            o = dtensor(o, DTensorSpec(mesh, tuple(p), TensorMeta(meta.shape, meta.stride, o.dtype)),
                        requires_grad=o.requires_grad)
        wrapped.append(o)
    return type(out)(wrapped) if isinstance(out, (list, tuple)) else wrapped[0]
