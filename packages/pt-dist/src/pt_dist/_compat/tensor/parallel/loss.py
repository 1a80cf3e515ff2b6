"""``loss_parallel()`` (torch's ``torch/distributed/tensor/parallel/loss.py``): cross entropy on logits sharded on
the class dim, without gathering them (Megatron-LM's vocab-parallel cross entropy, arXiv:1909.08053 section 3).

``log_softmax`` over a sharded dim: the max and the sum of exponentials are all-reduced, each rank keeps its slice
of the log-probabilities. ``nll_loss``: each rank picks the targets that fall in its class range (the others
masked to zero) and the picks are all-reduced. Backward of the pair is one step, ``exp(logp) - onehot(target)``
scaled by the loss's gradient, computed in ``nll_loss_backward`` (``log_softmax``'s backward then passes its
gradient through), as torch's. Inside the context the four aten ops on DTensors go to the functions here (a
``TorchDispatchMode``; torch registers them as custom handlers of its op dispatcher); ``backward()`` must run
inside it too.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pt_dist.tensor._api import DTensor
from pt_dist.tensor._collective_utils import mesh_all_reduce
from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._utils import local_shard_size_and_offset
from pt_dist.tensor.placement_types import Replicate

__all__ = ["loss_parallel"]

aten = torch.ops.aten
_NONE, _MEAN, _SUM = 0, 1, 2  # aten's reduction enum


def _sharded_mesh_dim(x: DTensor, dim: int) -> int:
    """The one mesh dim sharding tensor dim ``dim`` of ``x``; every other mesh dim must replicate it."""
    placements = x.placements
    dims = [i for i, p in enumerate(placements) if p.is_shard(dim)]
    if len(dims) != 1 or any(not p.is_replicate() for i, p in enumerate(placements) if i != dims[0]):
        raise ValueError(f"loss_parallel() requires the class dim {dim} sharded on exactly one mesh dim and the "
                         f"other mesh dims replicated; got placements {placements}")
    return dims[0]


def _local(t, mesh):
    """A target / weight / total weight as this rank's whole tensor (replicated DTensor or plain)."""
    if isinstance(t, DTensor):
        if any(not p.is_replicate() for p in t.placements):
            t = t.redistribute(mesh, [Replicate()] * mesh.ndim)
        return t._local_tensor
    return t


def _wrap(local: torch.Tensor, like: DTensor, shape) -> DTensor:
    spec = DTensorSpec(like.device_mesh, tuple(like.placements) if local.ndim == like.ndim else
                       (Replicate(),) * like.device_mesh.ndim,
                       TensorMeta(torch.Size(shape), torch.empty(shape, device="meta").stride(), local.dtype))
    return DTensor(local, spec, requires_grad=local.requires_grad)


def _log_softmax(x: DTensor, dim: int, half_to_float: bool) -> DTensor:
    dim = dim % x.ndim
    mesh, mesh_dim = x.device_mesh, _sharded_mesh_dim(x, dim)
    local = x._local_tensor.to(torch.float32 if half_to_float else x.dtype)
    shifted = local - mesh_all_reduce(torch.amax(local, dim, keepdim=True), "max", mesh, mesh_dim)
    sumexp = mesh_all_reduce(torch.exp(shifted).sum(dim, keepdim=True), "sum", mesh, mesh_dim)
    return _wrap(shifted - torch.log(sumexp), x, x.shape)


def _target_in_shard(x: DTensor, target: torch.Tensor, ignore_index: int, channel: int):
    """(this rank's column of each target, clamped to 0 where the target is elsewhere or ignored; that mask)."""
    mesh_dim = _sharded_mesh_dim(x, channel)
    length, start = local_shard_size_and_offset(x.shape[channel], x.device_mesh.size(mesh_dim),
                                                x.device_mesh.get_coordinate()[mesh_dim])
    local = torch.where(target != ignore_index, target, 0) - start
    outside = (local < 0) | (local >= length)
    return local.masked_fill(outside, 0), outside, mesh_dim


def _picked_weight(weight, target, ignore_index: int, dtype) -> torch.Tensor:
    safe = torch.where(target != ignore_index, target, 0)
    w = weight[safe] if weight is not None else torch.ones(target.shape, dtype=dtype)
    return torch.where(target != ignore_index, w.to(dtype), 0)


def _nll_loss_forward(x: DTensor, target, weight, reduction: int, ignore_index: int):
    mesh, channel = x.device_mesh, 1 if x.ndim >= 2 else 0
    target, weight = _local(target, mesh), _local(weight, mesh)
    cols, outside, mesh_dim = _target_in_shard(x, target, ignore_index, channel)
    picked = torch.gather(x._local_tensor, channel, cols.unsqueeze(channel)).squeeze(channel)
    picked = mesh_all_reduce(picked.masked_fill(outside, 0), "sum", mesh, mesh_dim)
    w = _picked_weight(weight, target, ignore_index, picked.dtype)
    result = -picked * w
    total_weight = w.sum() if reduction != _NONE or x.ndim < 2 else result.new_zeros(())
    if reduction == _SUM:
        result = result.sum()
    elif reduction == _MEAN:
        result = result.sum() / total_weight
    return _wrap(result, x, result.shape), total_weight


def _nll_loss_backward(grad_output, x: DTensor, target, weight, reduction: int, ignore_index: int, total_weight):
    """The gradient with respect to ``log_softmax``'s input: ``(exp(logp) - onehot(target)) * g``."""
    mesh, channel = x.device_mesh, 1 if x.ndim >= 2 else 0
    target, weight, grad = _local(target, mesh), _local(weight, mesh), _local(grad_output, mesh)
    total_weight = _local(total_weight, mesh)
    cols, outside, _ = _target_in_shard(x, target, ignore_index, channel)
    local = x._local_tensor
    g = (grad / total_weight if reduction == _MEAN else grad) * _picked_weight(weight, target, ignore_index,
                                                                                 local.dtype)
    onehot = torch.zeros_like(local).scatter_(channel, cols.unsqueeze(channel),
                                              (~outside).to(local.dtype).unsqueeze(channel))
    return _wrap((torch.exp(local) - onehot) * g.unsqueeze(channel), x, x.shape)


class _LossParallel(TorchDispatchMode):
    """The four ops on DTensors to the functions above; every other op as it is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._log_softmax.default and isinstance(args[0], DTensor):
            return _log_softmax(*args, **kwargs)
        if func is aten._log_softmax_backward_data.default and isinstance(args[0], DTensor):
            return aten._to_copy.default(args[0], dtype=args[3])
        if func is aten.nll_loss_forward.default and isinstance(args[0], DTensor):
            return _nll_loss_forward(*args, **kwargs)
        if func is aten.nll_loss_backward.default and isinstance(args[1], DTensor):
            return _nll_loss_backward(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def loss_parallel():
    """Inside: cross entropy (``log_softmax`` + ``nll_loss``) on logits ``Shard``-ed on the class dim computes
    the loss without gathering them (torch's ``loss_parallel``). The logits must be a DTensor (a
    ``ColwiseParallel`` output with ``use_local_output=False``), the target replicated; run ``backward()``
    inside too."""
    with _LossParallel():
        yield
