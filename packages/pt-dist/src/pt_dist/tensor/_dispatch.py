"""One aten op on DTensors (torch's ``tensor/_dispatch.py`` ``OpDispatcher.dispatch`` with
``_sharding_prop.py``): unwrap -> ask the op's sharding rule (``_ops/``) -> redistribute the arguments it asks
for -> run the op on the local tensors -> wrap the local results with the rule's output placements and the
global shape the op gives on meta tensors.

An op without a rule raises ``NotImplementedError`` naming it: nothing is gathered behind the caller's back. A
plain tensor argument is refused unless it holds one element (then it is a replicated scalar, as torch's).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._ops.utils import OpCall, rule_for
from pt_dist.tensor._redistribute import redistribute_local_tensor
from pt_dist.tensor.placement_types import Replicate

__all__ = ["dispatch"]

_META_CACHE: dict = {}


def _meta_key(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                      torch.layout)):
        return (type(x), x)
    return None  # not hashable as a value: no cache


def _global_meta(op, flat, tree):
    """The op's output(s) on meta tensors of the global shapes: global shape, stride and dtype of each output."""
    keys = tuple(_meta_key(x) for x in flat)
    key = (op, keys) if all(k is not None for k in keys) else None
    if key is not None and key in _META_CACHE:
        return _META_CACHE[key]
    from pt_dist.tensor._api import DTensor

    # a plain 0-d tensor stays as it is (a CPU scalar meets meta tensors); every other tensor becomes meta
    metas = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
             if isinstance(x, DTensor) or (isinstance(x, torch.Tensor) and x.ndim > 0) else x for x in flat]
    margs, mkwargs = tree_unflatten(metas, tree)
    out = op(*margs, **mkwargs)
    outs, _ = tree_flatten(out)
    result = [TensorMeta(o.shape, tuple(o.stride()), o.dtype) if isinstance(o, torch.Tensor) else None for o in outs]
    if key is not None:
        _META_CACHE[key] = result
    return result


def _returns_self(op) -> bool:
    """An in-place op (``add_``, ``copy_``): its first return aliases, and writes, its first argument."""
    rets = op._schema.returns
    return bool(rets) and rets[0].alias_info is not None and rets[0].alias_info.is_write


def dispatch(op, args, kwargs):
    from pt_dist.tensor._api import DTensor

    flat, tree = tree_flatten((args, kwargs))
    dtensors = [x for x in flat if isinstance(x, DTensor)]
    mesh = dtensors[0].device_mesh
    specs, positions = [], []
    for i, x in enumerate(flat):
        if isinstance(x, DTensor):
            if x.device_mesh != mesh:
                raise NotImplementedError(f"{op}: DTensor arguments on different meshes ({mesh} and "
                                          f"{x.device_mesh})")
            specs.append(x._spec)
            positions.append(i)
        elif isinstance(x, torch.Tensor):
            if x.numel() != 1:
                raise RuntimeError(f"{op}: got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
                                   "DTensor before calling distributed operators!")
            specs.append(DTensorSpec(mesh, (Replicate(),) * mesh.ndim,
                                     TensorMeta(x.shape, tuple(x.stride()), x.dtype)))
            positions.append(i)
    plain = [not isinstance(flat[pos], DTensor) for pos in positions]
    decision = rule_for(op)(OpCall(op, args, kwargs, specs, mesh, plain))

    local_flat = list(flat)
    for spec, pos, want in zip(specs, positions, decision.input_placements):
        x = flat[pos]
        if not isinstance(x, DTensor):
            continue
        local = x._local_tensor
        if want is not None and tuple(want) != spec.placements:
            if pos == 0 and _returns_self(op):
                raise RuntimeError(f"{op}: the in-place op would change self's placements {spec.placements} to "
                                   f"{tuple(want)}; redistribute self first")
            local = redistribute_local_tensor(local, spec, DTensorSpec(mesh, tuple(want), spec.tensor_meta))
        local_flat[pos] = local
    if decision.local_args is not None:  # the rule rewrote a non-tensor argument (a view's size) for the local op
        new_flat, new_tree = tree_flatten((decision.local_args, decision.local_kwargs or {}))
        if new_tree != tree:
            raise AssertionError(f"{op}: a rule's local arguments must keep the arguments' structure")
        local_flat = [lf if isinstance(x, torch.Tensor) else nf for x, lf, nf in zip(flat, local_flat, new_flat)]
    largs, lkwargs = tree_unflatten(local_flat, tree)
    out = op(*largs, **lkwargs)

    if _returns_self(op) and isinstance(flat[0], DTensor):
        return flat[0]
    if not any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
        return out  # a Python value (item(), a size): nothing to wrap, no meta run
    return _wrap(out, _global_meta(op, flat, tree), decision.output_placements, mesh, op)


def _wrap(out, metas, placements, mesh, op):
    from pt_dist.tensor._api import DTensor

    outs, spec_tree = tree_flatten(out)
    if not any(isinstance(o, torch.Tensor) for o in outs):
        return out
    per_output = placements if isinstance(placements, list) else [placements] * len(outs)
    wrapped = []
    for o, meta, p in zip(outs, metas, per_output):
        if isinstance(o, torch.Tensor):
            if p is None:
                raise NotImplementedError(f"{op}: its sharding rule gave no placement for an output")
            meta = TensorMeta(meta.shape, meta.stride, o.dtype)
            o = DTensor(o, DTensorSpec(mesh, tuple(p), meta), requires_grad=o.requires_grad)
        wrapped.append(o)
    return tree_unflatten(wrapped, spec_tree)
