"""``DTensor``: a ``torch.Tensor`` subclass whose data is this rank's local tensor and whose metadata is the global
tensor (torch's ``torch/distributed/tensor/_api.py``). Autograd records ops on the DTensor; below autograd,
``__torch_dispatch__`` hands every aten op to ``_dispatch.py``, which runs it on the local tensors with the
placements a sharding rule gives.

``from_local`` / ``to_local`` are autograd functions (``_FromTorchTensor`` / ``_ToTorchTensor``) so gradients
cross between plain and distributed code: a Shard forward gets a Shard gradient, Replicate gets Replicate, and
Partial gets Replicate (torch's guarantees).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pt_dist.device_mesh import DeviceMesh, _mesh_resources
from pt_dist.tensor._collective_utils import mesh_broadcast, mesh_scatter
from pt_dist.tensor._dispatch import dispatch
from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._redistribute import Redistribute, _padded_chunks, redistribute_local_tensor
from pt_dist.tensor._utils import (
    compute_global_tensor_info,
    contiguous_like_stride,
    local_shard_size_and_offset,
    normalize_placements,
)
from pt_dist.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["DTensor", "distribute_tensor"]


def _on_mesh(tensor: torch.Tensor, device_mesh, placements, what: str):
    """The mesh (by default the ``with mesh:`` one; this rank must be in it), ``tensor`` on its device type, and
    the placements (by default Replicate on every mesh dim) checked."""
    device_mesh = device_mesh or _mesh_resources.get_current_mesh()
    if not device_mesh._is_current_rank_part_of_mesh():
        raise NotImplementedError(f"{what}: rank {device_mesh.get_rank()} is not in {device_mesh}")
    if device_mesh.device_type != tensor.device.type and not tensor.is_meta:
        tensor = tensor.to(device_mesh.device_type)
    placements = [Replicate()] * device_mesh.ndim if placements is None else placements
    return tensor, device_mesh, normalize_placements(placements, tensor.ndim, device_mesh.ndim, what)


def _normalize_placements_for_grad(placements: Sequence[Placement]) -> tuple[Placement, ...]:
    return tuple(Replicate() if p.is_partial() else p for p in placements)


class _ToTorchTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: DTensor, grad_placements):
        ctx.spec, ctx.grad_placements = input._spec, grad_placements
        ctx.set_materialize_grads(False)
        return input._local_tensor.view_as(input._local_tensor)  # a fresh tensor: autograd writes into it

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output is None:
            return None, None
        spec = ctx.spec
        placements = ctx.grad_placements or _normalize_placements_for_grad(spec.placements)
        return DTensor.from_local(grad_output, spec.mesh, placements, shape=spec.shape,
                                  stride=contiguous_like_stride(spec.shape, grad_output.stride())), None


class _FromTorchTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input: torch.Tensor, device_mesh, placements, run_check, shape, stride, grad_placements):
        ctx.placements, ctx.mesh, ctx.grad_placements = placements, device_mesh, grad_placements
        ctx.set_materialize_grads(False)
        if shape is not None and stride is not None:
            global_shape, global_stride = torch.Size(shape), tuple(stride)
        elif shape is None and stride is None:
            gs, gst = compute_global_tensor_info(input, device_mesh, placements)
            global_shape, global_stride = torch.Size(gs), tuple(gst)
        else:
            raise RuntimeError(f"Found shape:{shape}, stride:{stride}. Please pass both shape and stride at the same "
                               "time.")
        if run_check:
            input = input.contiguous()
            for mesh_dim, p in enumerate(placements):
                if p.is_replicate():  # the mesh dim's first rank is the truth, as torch's run_check
                    mesh_broadcast(input, device_mesh, mesh_dim)
        spec = DTensorSpec(device_mesh, placements, TensorMeta(global_shape, global_stride, input.dtype))
        return DTensor(input.view_as(input), spec, requires_grad=input.requires_grad)

    @staticmethod
    def backward(ctx, grad_output):
        if grad_output is None:
            return (None,) * 7
        target = tuple(ctx.grad_placements or _normalize_placements_for_grad(ctx.placements))
        local, spec = grad_output._local_tensor, grad_output._spec
        if spec.placements != target:
            local = redistribute_local_tensor(local, spec, DTensorSpec(ctx.mesh, target, spec.tensor_meta))
        return (local,) + (None,) * 6


class DTensor(torch.Tensor):
    """A global tensor laid out over a ``DeviceMesh`` by one ``Placement`` per mesh dim (torch's ``DTensor``).
    Build one with ``DTensor.from_local`` or ``distribute_tensor``; the constructor is internal."""

    _local_tensor: torch.Tensor
    _spec: DTensorSpec
    __slots__ = ["_local_tensor", "_spec"]
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, local_tensor: torch.Tensor, spec: DTensorSpec, *, requires_grad: bool) -> DTensor:
        if local_tensor.requires_grad and not requires_grad:
            local_tensor = local_tensor.detach()
        r = torch.Tensor._make_wrapper_subclass(
            cls, spec.shape, strides=spec.stride, dtype=local_tensor.dtype, device=local_tensor.device,
            layout=local_tensor.layout, requires_grad=requires_grad)
        r._spec = spec
        r._local_tensor = local_tensor
        return r

    def __repr__(self) -> str:
        return (f"DTensor(local_tensor={self._local_tensor}, device_mesh={self._spec.mesh}, "
                f"placements={self._spec.placements})")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(cls, func, args, kwargs or {})

    def __tensor_flatten__(self):
        return ["_local_tensor"], (self._spec, self.requires_grad)

    @staticmethod
    def __tensor_unflatten__(inner_tensors, flatten_spec, outer_size, outer_stride):
        spec, requires_grad = flatten_spec
        meta = TensorMeta(outer_size, outer_stride, spec.tensor_meta.dtype)
        return DTensor(inner_tensors["_local_tensor"], DTensorSpec(spec.mesh, spec.placements, meta),
                       requires_grad=requires_grad)

    @staticmethod
    def from_local(local_tensor: torch.Tensor, device_mesh: DeviceMesh | None = None,
                   placements: Sequence[Placement] | None = None, *, run_check: bool = False,
                   shape: torch.Size | None = None, stride: tuple[int, ...] | None = None,
                   grad_placements: Sequence[Placement] | None = None) -> DTensor:
        """This rank's ``local_tensor`` as its part of a DTensor (no communication unless ``run_check``, which
        broadcasts the first rank's replica on Replicate dims). Without ``shape``/``stride`` every rank is
        assumed to hold an equal shard. Differentiable."""
        if isinstance(local_tensor, DTensor):
            raise RuntimeError(f"the local_tensor argument only accepts torch.Tensor but got {type(local_tensor)} "
                               "value.")
        local_tensor, device_mesh, placements = _on_mesh(local_tensor, device_mesh, placements, "DTensor.from_local")
        return _FromTorchTensor.apply(local_tensor, device_mesh, placements, run_check,
                                      None if shape is None else torch.Size(shape),
                                      None if stride is None else tuple(stride),
                                      None if grad_placements is None else tuple(grad_placements))

    def to_local(self, *, grad_placements: Sequence[Placement] | None = None) -> torch.Tensor:
        """This rank's local tensor (differentiable: its gradient comes back as ``grad_placements``, by default
        this DTensor's placements with Partial as Replicate)."""
        if not torch.is_grad_enabled():
            return self._local_tensor
        return _ToTorchTensor.apply(self, None if grad_placements is None else tuple(grad_placements))

    def redistribute(self, device_mesh: DeviceMesh | None = None, placements: Sequence[Placement] | None = None, *,
                     async_op: bool = False, forward_dtype: torch.dtype | None = None,
                     backward_dtype: torch.dtype | None = None) -> DTensor:
        """The same global tensor with ``placements`` (the collectives are listed in ``_redistribute.py``).
        ``async_op`` is accepted; pt_dist's result is complete when this returns."""
        device_mesh = device_mesh or self.device_mesh
        if placements is None:
            raise RuntimeError("placements is needed for redistribute!")
        if device_mesh != self.device_mesh:
            raise NotImplementedError(f"redistribute to another mesh ({self.device_mesh} -> {device_mesh}) is not "
                                      "supported")
        placements = normalize_placements(placements, self.ndim, device_mesh.ndim, "redistribute")
        for src, dst in zip(self.placements, placements):
            if dst.is_partial() and src != dst and not (isinstance(src, Shard) and type(dst) is Partial
                                                        and dst.reduce_op == "sum"):
                raise RuntimeError(f"Can not redistribute from {src} to {dst}, only Shard to Partial(sum) "
                                   "redistribution is supported!")
        return Redistribute.apply(self, device_mesh, placements, async_op, forward_dtype, backward_dtype)

    def full_tensor(self, *, grad_placements: Sequence[Placement] | None = None) -> torch.Tensor:
        """The whole tensor on every rank (``redistribute`` to Replicate, then ``to_local``)."""
        replicated = self.redistribute(placements=[Replicate()] * self.device_mesh.ndim)
        return _ToTorchTensor.apply(replicated, None if grad_placements is None else tuple(grad_placements))

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._spec.mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        return self._spec.placements

    def __reduce_ex__(self, protocol):
        return DTensor._rebuild, (self._local_tensor.detach(), self._spec, self.requires_grad)

    @staticmethod
    def _rebuild(local, spec, requires_grad):
        return DTensor(local, spec, requires_grad=requires_grad)


def _shard_from_source(tensor, dim: int, mesh, mesh_dim: int, src_data_rank: int | None) -> torch.Tensor:
    """This rank's chunk of ``tensor`` along ``dim``: scattered from the mesh dim's rank ``src_data_rank`` (the
    chunks padded to one size), or cut locally when ``src_data_rank`` is None (torch's ``Shard._shard_tensor``)."""
    n, rank = mesh.size(mesh_dim), mesh.get_coordinate()[mesh_dim]
    length, start = local_shard_size_and_offset(tensor.size(dim), n, rank)
    if src_data_rank is None:
        return tensor.narrow(dim, start, length).contiguous()
    pieces = [p.contiguous() for p in torch.tensor_split(_padded_chunks(tensor, dim, n), n, dim)]
    out = torch.empty_like(pieces[0])
    mesh_scatter(out, pieces, mesh, mesh_dim, group_src=src_data_rank)
    return out.narrow(dim, 0, length).contiguous()


def distribute_tensor(tensor: torch.Tensor, device_mesh: DeviceMesh | None = None,
                      placements: Sequence[Placement] | None = None, *, src_data_rank: int | None = 0) -> DTensor:
    """A leaf ``tensor`` (the global value; the mesh dims' rank ``src_data_rank`` is the truth) laid out as
    ``placements``: scattered for Shard, broadcast for Replicate and Partial (torch's ``distribute_tensor``)."""
    if not tensor.is_leaf:
        raise RuntimeError("`distribute_tensor` should be used to distribute leaf tensors! but found non-leaf "
                           "tensor!")
    tensor, device_mesh, placements = _on_mesh(tensor, device_mesh, placements, "distribute_tensor")
    if isinstance(tensor, DTensor):
        if tensor.device_mesh != device_mesh:
            raise ValueError(f"Cannot distribute a DTensor with device mesh {tensor.device_mesh} to a different "
                             f"device mesh {device_mesh}.")
        if tensor.placements != placements:
            raise ValueError(f"Cannot distribute a DTensor with placements {tensor.placements} to a different "
                             f"placements {placements}. do you want to call `redistribute` instead?")
        return tensor
    local = tensor.detach()
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            local = _shard_from_source(local, p.dim, device_mesh, mesh_dim, src_data_rank)
        else:
            if src_data_rank is not None:
                # in place, as torch's: a Replicate DTensor shares the (contiguous) source tensor's storage
                local = mesh_broadcast(local.contiguous(), device_mesh, mesh_dim, group_src=src_data_rank)
            if isinstance(p, Partial):
                local = p._partition_value(local, device_mesh, mesh_dim)
    spec = DTensorSpec(device_mesh, placements, TensorMeta(tensor.size(), tensor.stride(), tensor.dtype))
    return DTensor(local.requires_grad_(tensor.requires_grad), spec, requires_grad=tensor.requires_grad)

