"""Moving a DTensor between placements (torch's ``tensor/_redistribute.py`` and the placement methods of
``placement_types.py``), one mesh dim at a time:

    Shard(d) -> Replicate    all_gather along d (the short shards padded to the full chunk, the result cut back)
    Replicate -> Shard(d)    a local torch.chunk, no communication
    Partial -> Replicate     all_reduce
    Partial -> Shard(d)      reduce_scatter (the dim padded to a multiple of the mesh dim)
    Shard(i) -> Shard(j)     all_to_all
    Shard(d) -> Partial(sum) the shard placed into zeros, no communication
    Replicate -> Partial     the value divided by the mesh dim's size (sum), no communication

The plan (``_gen_transform_infos``) is torch's: first from the innermost mesh dim outwards, undoing shards of a
tensor dim that an outer mesh dim also shards differently, then outwards-in for what is left.
"""

from __future__ import annotations

import torch

from pt_dist.tensor._collective_utils import mesh_all_gather, shard_dim_alltoall
from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._utils import local_shard_size_and_offset, pad_dim
from pt_dist.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["Redistribute", "redistribute_local_tensor"]


def _logical_shape(global_shape, placements, coordinate, mesh, mesh_dim: int) -> list[int]:
    """The shape the mesh dim ``mesh_dim`` sees: the global shape cut by the shards of the mesh dims before it."""
    shape = list(global_shape)
    for i in range(mesh_dim):
        p = placements[i]
        if isinstance(p, Shard):
            shape[p.dim] = local_shard_size_and_offset(shape[p.dim], mesh.size(i), coordinate[i])[0]
    return shape


def _gen_transform_infos(src: DTensorSpec, dst: DTensorSpec) -> list[tuple[int, tuple[Placement, Placement]]]:
    """The steps, each (mesh dim, (its placement before, after))."""
    current, target = list(src.placements), list(dst.placements)
    steps = []
    if any(p.is_shard() and src.mesh.size(i) > 1 for i, p in enumerate(current)):  # (torch's num_shards > 1)
        for mesh_dim in reversed(range(len(current))):
            cur, tgt = current[mesh_dim], target[mesh_dim]
            if isinstance(tgt, Shard):
                before_cur = [i for i in range(mesh_dim) if current[i].is_shard(tgt.dim)]
                before_tgt = [i for i in range(mesh_dim) if target[i].is_shard(tgt.dim)]
                if before_cur != before_tgt:  # an outer shard of the same tensor dim moves: replicate here first
                    tgt = Replicate()
            if cur != tgt:
                steps.append((mesh_dim, (cur, tgt)))
                current[mesh_dim] = tgt
    for mesh_dim, (cur, tgt) in enumerate(zip(current, target)):
        if cur != tgt:
            steps.append((mesh_dim, (cur, tgt)))
            current[mesh_dim] = tgt
    return steps


def _shard_to_replicate(local, dim: int, logical: list[int], mesh, mesh_dim: int) -> torch.Tensor:
    n = mesh.size(mesh_dim)
    full = -(-logical[dim] // n)
    gathered = mesh_all_gather(pad_dim(local, dim, full - local.size(dim)), dim, mesh, mesh_dim)
    return gathered.narrow(dim, 0, logical[dim]).contiguous()


def _replicate_to_shard(local, dim: int, mesh, mesh_dim: int, rank: int) -> torch.Tensor:
    length, start = local_shard_size_and_offset(local.size(dim), mesh.size(mesh_dim), rank)
    return local.narrow(dim, start, length).clone(memory_format=torch.contiguous_format)


def _padded_chunks(local, dim: int, n: int) -> torch.Tensor:
    """``local`` cut as torch.chunk into ``n`` pieces along ``dim``, each padded to the full chunk, re-joined."""
    size = local.size(dim)
    full = -(-size // n)
    pieces = []
    for r in range(n):
        length, start = local_shard_size_and_offset(size, n, r)
        pieces.append(pad_dim(local.narrow(dim, start, length), dim, full - length))
    return torch.cat(pieces, dim)


def _partial_to_shard(local, partial: Partial, dim: int, mesh, mesh_dim: int, rank: int) -> torch.Tensor:
    n = mesh.size(mesh_dim)
    length, _ = local_shard_size_and_offset(local.size(dim), n, rank)
    out = partial._reduce_shard_value(_padded_chunks(local, dim, n), mesh, mesh_dim, Shard(dim))
    return out.narrow(dim, 0, length).contiguous()


def _shard_to_shard(local, old: int, new: int, logical: list[int], mesh, mesh_dim: int, rank: int) -> torch.Tensor:
    n = mesh.size(mesh_dim)
    full_old = -(-logical[old] // n)
    padded = pad_dim(local, old, full_old - local.size(old))
    padded = _padded_chunks(padded, new, n)
    out = shard_dim_alltoall(padded, old, new, mesh, mesh_dim)
    length_new, _ = local_shard_size_and_offset(logical[new], n, rank)
    return out.narrow(old, 0, logical[old]).narrow(new, 0, length_new).contiguous()


def _shard_to_partial(local, dim: int, logical: list[int], mesh, mesh_dim: int, rank: int) -> torch.Tensor:
    _, start = local_shard_size_and_offset(logical[dim], mesh.size(mesh_dim), rank)
    shape = list(local.shape)
    shape[dim] = logical[dim]
    out = local.new_zeros(shape)
    out.narrow(dim, start, local.size(dim)).copy_(local)
    return out


def redistribute_local_tensor(local: torch.Tensor, current_spec: DTensorSpec, target_spec: DTensorSpec
                              ) -> torch.Tensor:
    """This rank's local tensor of ``target_spec`` from its local tensor of ``current_spec`` (same mesh)."""
    mesh = current_spec.mesh
    if target_spec.mesh != mesh:
        raise NotImplementedError(f"redistribute across meshes ({mesh} -> {target_spec.mesh}) is not supported")
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise RuntimeError(f"rank {mesh.get_rank()} is not in {mesh}: it holds no part of this DTensor")
    placements = list(current_spec.placements)
    for mesh_dim, (src, dst) in _gen_transform_infos(current_spec, target_spec):
        logical = _logical_shape(current_spec.shape, placements, coordinate, mesh, mesh_dim)
        rank = coordinate[mesh_dim]
        if isinstance(dst, Replicate):
            if isinstance(src, Shard):
                local = _shard_to_replicate(local, src.dim, logical, mesh, mesh_dim)
            else:
                local = src._reduce_value(local, mesh, mesh_dim)
        elif isinstance(dst, Shard):
            if isinstance(src, Shard):
                local = _shard_to_shard(local, src.dim, dst.dim, logical, mesh, mesh_dim, rank)
            elif isinstance(src, Replicate):
                local = _replicate_to_shard(local, dst.dim, mesh, mesh_dim, rank)
            else:
                local = _partial_to_shard(local, src, dst.dim, mesh, mesh_dim, rank)
        elif isinstance(dst, Partial):
            if isinstance(src, Replicate):
                local = dst._partition_value(local, mesh, mesh_dim)
            elif isinstance(src, Shard) and type(dst) is Partial and dst.reduce_op == "sum":
                local = _shard_to_partial(local, src.dim, logical, mesh, mesh_dim, rank)
            else:
                raise RuntimeError(f"Can not redistribute from {src} to {dst} on mesh dim {mesh_dim}")
        else:
            raise RuntimeError(f"redistribute: unsupported placement {dst!r}")
        placements[mesh_dim] = dst
    return local


class Redistribute(torch.autograd.Function):
    """``DTensor.redistribute`` as an autograd function: the gradient goes back to the source placements, a
    Partial source getting a Replicate gradient (torch's ``Redistribute`` / ``_redistribute_backward``)."""

    @staticmethod
    def forward(ctx, input, device_mesh, placements, async_op: bool = False, forward_dtype=None,
                backward_dtype=None):
        current, local = input._spec, input._local_tensor
        ctx.in_dtype, ctx.backward_dtype = local.dtype, backward_dtype or local.dtype
        if forward_dtype is not None and forward_dtype != local.dtype:
            local = local.to(forward_dtype)
            current = DTensorSpec(current.mesh, current.placements,
                                  TensorMeta(current.shape, current.stride, forward_dtype))
        ctx.current_spec = current
        target = DTensorSpec(device_mesh, tuple(placements), current.tensor_meta)
        out = local if current.placements == target.placements else redistribute_local_tensor(local, current, target)
        return type(input)(out, target, requires_grad=input.requires_grad)  # (the DTensor class: no import cycle)

    @staticmethod
    def backward(ctx, grad_output):
        previous = ctx.current_spec
        grad_spec = grad_output._spec
        local = grad_output._local_tensor.to(ctx.backward_dtype)
        placements = tuple(Replicate() if t.is_partial() and not c.is_partial() else t
                           for c, t in zip(grad_spec.placements, previous.placements))
        meta = TensorMeta(grad_spec.shape, grad_spec.stride, local.dtype)
        out = redistribute_local_tensor(local, DTensorSpec(grad_spec.mesh, grad_spec.placements, meta),
                                        DTensorSpec(previous.mesh, placements, meta)).to(ctx.in_dtype)
        spec = DTensorSpec(previous.mesh, placements, TensorMeta(grad_spec.shape, grad_spec.stride, out.dtype))
        return type(grad_output)(out, spec, requires_grad=False), None, None, None, None, None
