"""``fully_shard``'s construction steps: validate the module and mesh, pick the mesh info, collect the managed
modules / parameters, move them to the mesh's device, and swap in the ``FSDP<Class>`` class (torch's
torch/distributed/fsdp/_fully_shard/_fsdp_init.py)."""

from __future__ import annotations

import itertools
import logging

import torch
from torch import nn

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo
from pt_dist.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

logger = logging.getLogger("pt_dist.fsdp.fully_shard")


def _validate_module(module, func_name: str) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"{func_name}: module must be an nn.Module, got {type(module).__name__}: {module!r}")
    if isinstance(module, (nn.ModuleList, nn.ModuleDict)) and module.__class__.forward is nn.Module.forward:
        raise ValueError(f"{func_name} does not support containers that do not implement forward: {module}")


def _validate_mesh(mesh) -> None:
    from pt_dist.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a pt_dist.device_mesh.DeviceMesh (init_device_mesh), got "
                        f"{type(mesh).__module__}.{type(mesh).__name__}: {mesh!r}")
    if mesh.get_coordinate() is None:
        raise ValueError(f"fully_shard: this rank ({c10d.get_rank()}) is not in the mesh {mesh} (ranks "
                         f"{mesh.mesh.flatten().tolist()})")
    if mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard expects a 1D or 2D DeviceMesh but got {mesh}")
    if mesh.ndim == 2 and mesh.mesh_dim_names is None:
        raise AssertionError("Please init the 2D mesh for HSDP with mesh_dim_names specified")


def _get_mesh_info(mesh) -> FSDPMeshInfo:
    """1-D: shard over it (FSDP). 2-D: replicate over dim 0, shard over dim 1 (HSDP)."""
    if mesh.ndim == 1:
        return FSDPMeshInfo(mesh, shard_mesh_dim=0)
    return HSDPMeshInfo(mesh, shard_mesh_dim=1, replicate_mesh_dim=0)


def _get_post_forward_mesh_info(reshard_after_forward, mesh_info: FSDPMeshInfo) -> FSDPMeshInfo | None:
    """``True``: reshard to the shard mesh after forward (``mesh_info``); ``False``: keep unsharded (``None``)."""
    if not isinstance(reshard_after_forward, (bool, int)):
        raise ValueError("reshard_after_forward should be a bool or an int representing the group size to reshard "
                         f"to, not {reshard_after_forward}")
    shard_mesh_size = mesh_info.shard_mesh_size
    if not isinstance(reshard_after_forward, bool):
        if reshard_after_forward < 1 or reshard_after_forward > shard_mesh_size or \
                shard_mesh_size % reshard_after_forward != 0:
            raise ValueError("If passing reshard_after_forward as an int, it should be a factor of "
                             f"{shard_mesh_size}, not {reshard_after_forward}")
        if reshard_after_forward == 1:
            logger.warning("reshard_after_forward=1 (int) means resharding parameters to world size 1, instead of "
                           "reshard_after_forward=True (bool)")
            reshard_after_forward = False
        elif reshard_after_forward == shard_mesh_size:
            reshard_after_forward = True
        else:
            raise NotImplementedError(f"fully_shard: reshard_after_forward={reshard_after_forward} (resharding to a "
                                      f"smaller world than {shard_mesh_size} after forward) is not supported here")
    return mesh_info if reshard_after_forward else None


def _init_default_mesh():
    """The whole default pt_dist group as a 1-D mesh (initializing it from env:// if needed, as torch does)."""
    from pt_dist.device_mesh import init_device_mesh

    if not c10d.is_initialized():
        c10d.init_process_group()
    device_type = "cuda" if c10d.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device_type, (c10d.get_world_size(),))


def _get_device_from_mesh(mesh) -> torch.device:
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    handle = getattr(torch, mesh.device_type)
    return torch.device(mesh.device_type, handle.current_device())


def _get_managed_modules(root_modules: tuple[nn.Module, ...]) -> list[nn.Module]:
    """The modules this call manages: the tree below the root, not entering a nested ``fully_shard`` module."""
    modules: list[nn.Module] = []
    root_set, visited = set(root_modules), set()

    def dfs(module: nn.Module) -> None:
        if module not in root_set and _get_module_fsdp_state(module) is not None:
            return  # nested fully_shard module: its own group
        visited.add(module)
        for submodule in module.children():
            if submodule not in visited:
                dfs(submodule)
        modules.append(module)

    for root in root_modules:
        dfs(root)
    return modules


def _get_managed_states(modules: list[nn.Module], ignored_params: set[nn.Parameter] | None = None):
    params, buffers, seen_params, seen_buffers = [], [], set(), set()
    ignored_params = ignored_params or set()
    for module in modules:
        for name, param in module.named_parameters(recurse=False):
            if param in ignored_params or param in seen_params:
                continue
            if param.dim() == 0:
                raise ValueError(f"fully_shard doesn't support scalar parameters. Change {name} to a 1D tensor with "
                                 "numel equal to 1.")
            params.append(param)
            seen_params.add(param)
        for buffer in module.buffers(recurse=False):
            if buffer not in seen_buffers:
                buffers.append(buffer)
                seen_buffers.add(buffer)
    return params, buffers


def _move_states_to_device(params: list[nn.Parameter], buffers: list[torch.Tensor], device: torch.device) -> None:
    for tensor in itertools.chain(params, buffers):
        if tensor.device == device or tensor.device.type == "meta":
            continue  # meta tensors stay for deferred init
        tensor.data = tensor.to(device)


def _apply_to_module(modules: tuple[nn.Module, ...], cls_to_wrapper_cls: dict[type, type], wrapper_module_cls: type,
                     wrapper_cls_prefix: str, unimplemented_deepcopy) -> None:
    """Swap each module's class for ``FSDP<Class>(FSDPModule, Class)``, one new class per original class."""
    for module in modules:
        cls = module.__class__
        new_cls = cls_to_wrapper_cls.get(cls)
        if not new_cls:
            new_cls = type(f"{wrapper_cls_prefix}{cls.__name__}", (wrapper_module_cls, cls),
                           {"__deepcopy__": unimplemented_deepcopy})
            cls_to_wrapper_cls[cls] = new_cls
        module.__class__ = new_cls
