"""The collectives of one mesh dim, on that dim's pt_dist group (torch's ``tensor/_collective_utils.py`` and the
functional collectives DTensor calls): each takes equal-sized inputs (the caller pads uneven shards) and returns a
new tensor, leaving its input alone."""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.process_group import ReduceOp

__all__ = ["mesh_all_gather", "mesh_all_reduce", "mesh_broadcast", "mesh_reduce_scatter", "mesh_scatter",
           "shard_dim_alltoall"]


def mesh_broadcast(tensor: torch.Tensor, mesh, mesh_dim: int, group_src: int = 0) -> torch.Tensor:
    """``tensor`` of the mesh dim's rank ``group_src`` on every rank of the dim, in place."""
    c10d.broadcast(tensor, group=mesh.get_group(mesh_dim), group_src=group_src)
    return tensor


def mesh_scatter(output: torch.Tensor, scatter_list: list[torch.Tensor], mesh, mesh_dim: int,
                 group_src: int = 0) -> torch.Tensor:
    """``scatter_list[i]`` of the dim's rank ``group_src`` into ``output`` on the dim's rank ``i``."""
    group = mesh.get_group(mesh_dim)
    mine = c10d.get_rank(group) == group_src
    c10d.scatter(output, scatter_list if mine else None, group=group, group_src=group_src)
    return output


def mesh_all_gather(tensor: torch.Tensor, gather_dim: int, mesh, mesh_dim: int) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``gather_dim``, rank order."""
    n = mesh.size(mesh_dim)
    moved = tensor.movedim(gather_dim, 0).contiguous()
    out = moved.new_empty((n * moved.size(0), *moved.shape[1:]))
    c10d.all_gather_into_tensor(out, moved, group=mesh.get_group(mesh_dim))
    return out.movedim(0, gather_dim)


def mesh_all_reduce(tensor: torch.Tensor, reduce_op: str, mesh, mesh_dim: int) -> torch.Tensor:
    out = tensor.contiguous().clone()
    c10d.all_reduce(out, ReduceOp.of(reduce_op), group=mesh.get_group(mesh_dim))
    return out


def mesh_reduce_scatter(tensor: torch.Tensor, reduce_op: str, scatter_dim: int, mesh, mesh_dim: int
                        ) -> torch.Tensor:
    """The reduction of every rank's ``tensor``, chunk ``i`` of ``scatter_dim`` kept by the dim's rank ``i``
    (``tensor.size(scatter_dim)`` a multiple of the dim's size)."""
    n = mesh.size(mesh_dim)
    moved = tensor.movedim(scatter_dim, 0).contiguous()
    out = moved.new_empty((moved.size(0) // n, *moved.shape[1:]))
    c10d.reduce_scatter_tensor(out, moved, ReduceOp.of(reduce_op), group=mesh.get_group(mesh_dim))
    return out.movedim(0, scatter_dim)


def shard_dim_alltoall(tensor: torch.Tensor, gather_dim: int, scatter_dim: int, mesh, mesh_dim: int
                       ) -> torch.Tensor:
    """Chunk ``j`` of ``scatter_dim`` to the dim's rank ``j``, the received chunks concatenated along
    ``gather_dim`` (``Shard(gather_dim) -> Shard(scatter_dim)``; both sizes padded to multiples)."""
    n = mesh.size(mesh_dim)
    chunks = torch.stack(list(tensor.chunk(n, scatter_dim))).contiguous()  # [n, ...]: chunk j for rank j
    out = torch.empty_like(chunks)
    c10d.all_to_all_single(out, chunks, group=mesh.get_group(mesh_dim))
    return torch.cat(list(out.unbind(0)), gather_dim)
