"""``torch.distributed.tensor.experimental`` (torch's ``experimental/__init__.py`` and ``_func_map.py``):
``implicit_replication`` (plain tensors meeting DTensors taken as replicated, the core dispatcher's
``allow_implicit_replication``), ``local_map`` (a function written for local tensors applied to DTensors'
local parts, its outputs wrapped with ``out_placements``) and ``register_sharding`` (a user's list of acceptable
(output, input) placements for an op, made a sharding rule: on each mesh dim the one needing the cheapest
redistribution, as torch's strategy expansion picks by cost)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch.utils import _pytree as pytree

from pt_dist.tensor import _dispatch
from pt_dist.tensor._api import DTensor
from pt_dist.tensor._ops.utils import OpCall, OutputSharding, pick, register_prop_rule

__all__ = ["implicit_replication", "local_map", "register_sharding"]


@contextlib.contextmanager
def implicit_replication() -> Iterator[None]:
    """Inside, a ``torch.Tensor`` given to an op with DTensors is taken as a Replicate DTensor (it must then hold
    the same value on every rank: nothing checks it, as torch's)."""
    try:
        _dispatch.allow_implicit_replication = True
        yield
    finally:
        _dispatch.allow_implicit_replication = False


def local_map(func: Callable | None = None, out_placements=None, in_placements=None, in_grad_placements=None,
              device_mesh=None, *, redistribute_inputs: bool = False, spmd_types: bool = False):
    """``func`` run on the local tensors of its DTensor arguments (checked against, or with
    ``redistribute_inputs`` redistributed to, ``in_placements``; their gradients as ``in_grad_placements``),
    each tensor output wrapped as a DTensor with its ``out_placements``. Usable as a decorator."""
    if spmd_types:
        raise RuntimeError("spmd_types=True requires the spmd_types package to be installed")
    if func is None:
        return functools.partial(local_map, out_placements=out_placements, in_placements=in_placements,
                                 in_grad_placements=in_grad_placements, device_mesh=device_mesh,
                                 redistribute_inputs=redistribute_inputs)
    return functools.partial(_local_map_wrapped, func, out_placements, in_placements, in_grad_placements,
                             device_mesh, redistribute_inputs)


def _local_map_wrapped(func, out_placements, in_placements, in_grad_placements, device_mesh, redistribute_inputs,
                       *args, **kwargs):
    flat_args, args_spec = pytree.tree_flatten(args)
    if in_placements is not None and len(in_placements) != len(flat_args):
        raise AssertionError(f"in_placements length {len(in_placements)} does not match the number of input args "
                             f"{len(flat_args)}!")
    flat_local, seen = [], False
    for i, arg in enumerate(flat_args):
        if not isinstance(arg, DTensor):
            if in_placements is not None and not isinstance(arg, torch.Tensor) and in_placements[i] is not None:
                raise AssertionError(f"Non-Tensor input {arg} expects None placements but received "
                                     f"{in_placements[i]}!")
            flat_local.append(arg)
            continue
        device_mesh, seen = device_mesh or arg.device_mesh, True
        if in_placements is not None:
            want = in_placements[i]
            if want is None:
                raise AssertionError(f"DTensor input {arg} expects placements but received {want}!")
            if tuple(arg.placements) != tuple(want):
                if not redistribute_inputs:
                    raise ValueError(f"arg {arg} in local_map has a mismatched placements: arg placements is "
                                     f"{tuple(arg.placements)} but the input placements is {tuple(want)}! If "
                                     f"redistribute_inputs is wanted, set redistribute_inputs=True to local_map.")
                arg = arg.redistribute(placements=tuple(want))
        grad = None if in_grad_placements is None else in_grad_placements[i]
        if in_grad_placements is not None and grad is None:
            raise AssertionError(f"DTensor input {arg} expects in grad placements but received {grad}!")
        flat_local.append(arg.to_local(grad_placements=None if grad is None else tuple(grad)))
    out = func(*pytree.tree_unflatten(flat_local, args_spec), **kwargs)
    if not seen:  # no DTensor in: a plain call, out_placements ignored (as torch's)
        return out
    flat_out, out_spec = pytree.tree_flatten(out)
    per_out = out_placements if isinstance(out_placements, tuple) else (out_placements,)
    if len(flat_out) != len(per_out):
        raise AssertionError(f"local_map requires one PlacementType be provided for each output value, received "
                             f"{len(per_out)} out_placements but {len(flat_out)} is expected!")
    wrapped = []
    for o, p in zip(flat_out, per_out):
        if isinstance(o, DTensor):
            raise AssertionError(f"torch.Tensor output expected but received {type(o)}: {o}")
        if isinstance(o, torch.Tensor):
            wrapped.append(DTensor.from_local(o, device_mesh, p, run_check=False))
        elif p is not None:
            raise AssertionError(f"Non-tensor output {o} expects None placements but received {p}!")
        else:
            wrapped.append(o)
    return pytree.tree_unflatten(wrapped, out_spec)


def register_sharding(op):
    """Decorator: ``fn(*args, **kwargs)``, called with each DTensor argument's spec in its place, returns
    ``[(output_placements, input_placements), ...]`` (one placement per output / per argument, None for a
    non-tensor), the layouts ``op`` accepts on one mesh dim; it becomes ``op``'s sharding rule, over any existing."""

    def wrapper(fn):
        @register_prop_rule(op if isinstance(op, list) else [op])
        def rule(call: OpCall) -> OutputSharding:
            def as_spec(a):
                return a._spec if isinstance(a, DTensor) else a

            strategies = fn(*pytree.tree_map(as_spec, call.args), **pytree.tree_map(as_spec, call.kwargs))
            tensors = [i for i, a in enumerate(call.args) if isinstance(a, torch.Tensor)]
            choices = [(*(inputs[i] for i in tensors), *outputs) for outputs, inputs in strategies]
            n = len(call.specs)
            picked = [pick(call.specs, choices, m) for m in range(call.mesh_ndim)]
            outs = [tuple(best[j] for best in picked) for j in range(n, len(picked[0]))]
            return OutputSharding([tuple(best[i] for best in picked) for i in range(n)],
                                  outs[0] if len(outs) == 1 else outs)

        _dispatch._CACHE.clear()  # (decisions made under the former rule)
        return fn

    return wrapper
