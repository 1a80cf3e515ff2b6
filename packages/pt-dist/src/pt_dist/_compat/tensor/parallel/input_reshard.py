"""``input_reshard`` (torch/distributed/tensor/parallel/input_reshard.py): for a tensor-parallel module whose input
is replicated over the TP ranks, what autograd saves in its forward is kept sharded along ``input_reshard_dim``
(1/N of it per rank) and all-gathered back when backward needs it: saved-tensor hooks entered at the module's
forward pre-hook and left at its forward hook. As torch's, every saved plain tensor with at least as many elements
as the mesh is cut, and a replicated DTensor too."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from pt_dist.device_mesh import DeviceMesh
from pt_dist.tensor._api import DTensor
from pt_dist.tensor.placement_types import Replicate, Shard

__all__ = ["input_reshard"]


def input_reshard(module: nn.Module, tp_device_mesh: DeviceMesh, input_reshard_dim: int | None = None) -> nn.Module:
    """Register the hooks on ``module`` (nothing when ``input_reshard_dim`` is None); returns ``module``."""
    if input_reshard_dim is None:
        return module
    active: list = []

    def enter(_module, _inputs) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(
            functools.partial(_pack, tp_device_mesh, input_reshard_dim),
            functools.partial(_unpack, tp_device_mesh, input_reshard_dim))
        hooks.__enter__()
        active.append(hooks)

    def leave(_module, _inputs, _output) -> None:
        active.pop().__exit__()

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)
    return module


def _pack(mesh: DeviceMesh, dim: int, x: torch.Tensor) -> Any:
    """A saved replicated tensor, kept as this rank's ``Shard(dim)`` part of it."""
    if isinstance(x, DTensor):
        return x.redistribute(mesh, [Shard(dim)]) if all(p.is_replicate() for p in x.placements) else x
    if isinstance(x, torch.Tensor) and x.numel() >= mesh.size():
        return DTensor.from_local(x, mesh, [Replicate()]).redistribute(mesh, [Shard(dim)]).to_local()
    return x


def _unpack(mesh: DeviceMesh, dim: int, x: Any) -> torch.Tensor:
    """The saved tensor whole again (an all-gather over the TP ranks)."""
    if isinstance(x, DTensor):
        return x.redistribute(mesh, [Replicate()]) if len(x.placements) == 1 and x.placements[0].is_shard() else x
    if isinstance(x, torch.Tensor) and x.numel() >= mesh.size():
        return DTensor.from_local(x, mesh, [Shard(dim)]).redistribute(mesh, [Replicate()]).to_local()
    return x
