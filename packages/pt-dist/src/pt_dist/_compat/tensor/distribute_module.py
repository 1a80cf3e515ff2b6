"""``distribute_module`` (torch's, in ``tensor/_api.py``): a module's parameters and buffers made DTensors by a
``partition_fn`` (Replicate where it leaves them plain), its inputs and outputs converted by forward hooks. torch's
tensor-parallel styles are built on it."""

from __future__ import annotations

import inspect

import torch

from pt_dist.device_mesh import DeviceMesh, _mesh_resources
from pt_dist.tensor._api import DTensor, distribute_tensor
from pt_dist.tensor.placement_types import Replicate

__all__ = ["distribute_module"]


def distribute_module(module: torch.nn.Module, device_mesh: DeviceMesh | None = None, partition_fn=None,
                      input_fn=None, output_fn=None) -> torch.nn.Module:
    """``partition_fn(name, submodule, mesh)`` on every submodule, every parameter and buffer it left plain then
    replicated; ``input_fn(module, inputs, mesh)`` / ``output_fn(module, outputs, mesh)`` as forward hooks
    (torch's ``distribute_module``, without its deprecated two-argument callbacks)."""
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module should only be called once on a module, but it has already been "
                           "called on this module!")
    device_mesh = device_mesh or _mesh_resources.get_current_mesh()
    for fn, what in ((input_fn, "input_fn"), (output_fn, "output_fn")):
        if fn is not None and len(inspect.signature(fn).parameters) != 3:
            raise ValueError(f"{what} should take in 3 arguments, but got "
                             f"{len(inspect.signature(fn).parameters)} arguments!")
    replicate = [Replicate()] * device_mesh.ndim
    for name, sub in module.named_modules():
        if partition_fn is not None:
            partition_fn(name, sub, device_mesh)
        for key, param in sub._parameters.items():
            if param is not None and not isinstance(param, DTensor):
                sub.register_parameter(key, torch.nn.Parameter(distribute_tensor(param.data, device_mesh, replicate),
                                                               requires_grad=param.requires_grad))
        for key, buf in sub._buffers.items():
            if buf is not None and not isinstance(buf, DTensor):
                sub._buffers[key] = distribute_tensor(buf, device_mesh, replicate)
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    module._distribute_module_applied = True
    return module
