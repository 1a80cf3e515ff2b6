"""Small pieces of FSDP's runtime (torch's fsdp/_runtime_utils.py and ``FSDP.clip_grad_norm_``): casting forward
inputs for mixed precision, a weak callback to a unit, and the gradient-norm clip over sharded gradients."""

from __future__ import annotations

import weakref

import torch

from pt_dist import distributed_c10d as c10d


def weak_method(obj, name: str):
    """``obj.<name>()`` without holding ``obj``."""
    ref = weakref.ref(obj)
    return lambda: getattr(ref(), name)()


def cast_buffers(units) -> dict:
    """At the root's first run: each unit's floating-point buffers to its ``MixedPrecision.buffer_dtype``, the
    ignored modules' left alone, as torch's; returns ``{id(buffer): (buffer, original dtype)}`` so state dicts
    save them in their own dtype again."""
    ignored = set().union(*(u._ignored for u in units))
    nested = {id(u) for u in units}
    original = {}

    def own_modules(module):
        yield module
        for child in module.children():
            if id(child) not in nested:
                yield from own_modules(child)

    for u in units:
        dtype = u.mixed_precision.buffer_dtype
        if dtype is None:
            continue
        for m in own_modules(u.module):
            if m in ignored:
                continue
            for b in m._buffers.values():
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    original[id(b)] = (b, b.dtype)
                    b.data = b.data.to(dtype)
    return original


def saved_buffer(unit, t: torch.Tensor) -> torch.Tensor:
    """A buffer as a state dict holds it: detached, or copied back to the dtype it had before the cast."""
    root = unit._root or unit
    entry = getattr(root, "_orig_buffer_dtypes", {}).get(id(t))
    return t.detach().to(entry[1]) if entry is not None and entry[0] is t else t.detach()


def cast_floats(obj, dtype):
    """``obj`` (tensors in nested lists, tuples and dicts) with its floating-point tensors cast to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_floats(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    return obj


def clip_grad_norm_(grads: list, max_norm: float, norm_type: float, group) -> torch.Tensor:
    """Scale ``grads`` (this rank's shards) so the whole model's gradient norm is at most ``max_norm``; the
    shards' norms are combined over ``group`` (None: the gradients are whole here). Returns the total norm."""
    norm_type = float(norm_type)
    if norm_type == float("inf"):
        local = torch.stack([g.abs().max() for g in grads]).max() if grads else torch.zeros(())
        total = local.double().reshape(1)
        op = "max"
    else:
        zero = torch.zeros((), dtype=torch.float64, device=grads[0].device if grads else None)
        total = sum((g.double().abs().pow(norm_type).sum() for g in grads), zero)
        total, op = total.reshape(1), "sum"
    if group is not None:
        c10d.all_reduce(total, op=op, group=group)
    total = total[0] if norm_type == float("inf") else total[0] ** (1.0 / norm_type)
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return total.to(torch.float32)
