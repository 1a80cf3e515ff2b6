"""Whole-state-dict moves ``state_dict.py`` needs (torch/distributed/_state_dict_utils.py): gather every DTensor
to its full tensor (``full_state_dict``), offload to the CPU, and the way back: cut full tensors into the local
blocks of the DTensors a model holds (``_distribute_state_dict``), or first broadcast them from rank 0, one
tensor at a time (``_broadcast_state_dict``, for ``broadcast_from_rank0``)."""

from __future__ import annotations

from typing import Any

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.object_collectives import broadcast_object_list
from pt_dist.tensor import DTensor
from pt_dist.tensor._utils import compute_local_shape_and_global_offset


def _is_dtensor(value) -> bool:
    return isinstance(value, DTensor)


def _map_tensors(value: Any, fn):
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_tensors(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(_map_tensors(v, fn) for v in value)
    return fn(value) if isinstance(value, torch.Tensor) else value


def _gather_state_dict(state_dict: dict, cpu_offload: bool = False, ranks_only: tuple = ()) -> dict:
    """Every DTensor replaced by its full tensor (collective: every rank walks the dict in the same order);
    with ``ranks_only`` the result is kept on those global ranks and ``{}`` elsewhere."""
    def full(t):
        t = t.full_tensor() if _is_dtensor(t) else t
        return t.cpu() if cpu_offload else t

    out = _map_tensors(state_dict, full)
    if ranks_only and c10d.is_initialized() and c10d.get_rank() not in ranks_only:
        return {}
    return out


def _offload_state_dict_to_cpu(state_dict: dict) -> dict:
    def cpu(t):
        if _is_dtensor(t):
            return DTensor.from_local(t.to_local().cpu(), t.device_mesh, t.placements, run_check=False,
                                      shape=t.shape, stride=t.stride())
        return t.cpu()

    return _map_tensors(state_dict, cpu)


def _target_device(local, device):
    """Where a value for ``local`` goes: its device, or ``device`` (default the CPU) for a meta-device one."""
    here = local.to_local().device if _is_dtensor(local) else local.device
    return (device or torch.device("cpu")) if here.type == "meta" else here


def _local_block(full: torch.Tensor, like, device=None):
    """``full`` cut to the block ``like`` (a DTensor) holds on this rank, as a DTensor like it."""
    if any(p.is_partial() for p in like.placements):
        raise ValueError(f"cannot cut a full tensor into a Partial DTensor ({like.placements})")
    if tuple(full.shape) != tuple(like.shape):
        raise ValueError(f"a full tensor of shape {tuple(full.shape)} for a DTensor of shape {tuple(like.shape)}")
    sizes, offsets = compute_local_shape_and_global_offset(like.shape, like.device_mesh, like.placements)
    local = full
    for dim, (size, offset) in enumerate(zip(sizes, offsets)):
        local = local.narrow(dim, min(offset, full.size(dim)), size)
    local = local.to(device=_target_device(like, device), dtype=like.dtype, memory_format=torch.contiguous_format,
                     copy=True)
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                              stride=like.stride())


def _place(value, local, device=None):
    """What ``local``'s slot takes from the full ``value``: its block (a DTensor), the tensor in its device and
    dtype, or the value itself. Tensors are copies: an optimizer's ``load_state_dict`` keeps what it is given,
    and a full state dict may be another live optimizer's own state (``cpu_offload`` of CPU tensors is them)."""
    if _is_dtensor(local) and isinstance(value, torch.Tensor):
        return _local_block(value.full_tensor() if _is_dtensor(value) else value, local, device)
    if isinstance(local, torch.Tensor) and isinstance(value, torch.Tensor):
        return value.to(device=_target_device(local, device), dtype=local.dtype, copy=True)
    return value


def _distribute_state_dict(full_state_dict: dict, local_state_dict: dict, device=None) -> None:
    """``local_state_dict[k]`` := this rank's part of ``full_state_dict[k]`` (flat dicts; in place)."""
    for key in list(local_state_dict):
        if key in full_state_dict:
            local_state_dict[key] = _place(full_state_dict[key], local_state_dict[key], device)


def _broadcast_state_dict(full_state_dict: dict, local_state_dict: dict, device=None, strict: bool = False,
                          cpu_offload: bool = False) -> None:
    """Rank 0's ``full_state_dict`` to every rank, a tensor at a time, each kept only as the part this rank's
    ``local_state_dict`` holds (flat dicts; in place; collective over the world)."""
    rank0 = c10d.get_rank() == 0
    skeleton = [{k: ("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ("value", v)
                 for k, v in full_state_dict.items()} if rank0 else None]
    broadcast_object_list(skeleton, src=0)
    missing = sorted(set(local_state_dict) - set(skeleton[0]))
    if strict and missing:
        raise RuntimeError(f"broadcast_from_rank0: rank 0's state dict lacks {missing[:8]}")
    for key, entry in skeleton[0].items():
        if entry[0] == "value":
            local_state_dict[key] = entry[1]
            continue
        t = full_state_dict[key] if rank0 else None
        t = t.full_tensor() if rank0 and _is_dtensor(t) else t
        buf = t.detach().cpu().contiguous() if rank0 else torch.empty(entry[1], dtype=entry[2])
        c10d.broadcast(buf, src=0)
        local_state_dict[key] = _place(buf, local_state_dict[key], device) if key in local_state_dict else buf
