"""``FSDPParam``: one parameter sharded on dim 0 across the mesh's shard dim (torch's
torch/distributed/fsdp/_fully_shard/_fsdp_param.py).

The tensors of one parameter (torch's [Note: FSDP tensors]):

- the *sharded parameter*: this rank's ``torch.chunk`` of dim 0, registered on the module as an ``nn.Parameter``
  wrapping a ``DTensor`` (``Shard(0)``, HSDP ``(Replicate(), Shard(0))``) between iterations; the optimizer steps it.
  Its local tensor is a view into ``_sharded_param_data``, the chunk padded with zeros to the first (longest)
  chunk's size, so every rank sends the same number of elements and no padding is done per all-gather;
- the *all-gather input*: ``_sharded_param_data`` cast to ``param_dtype``;
- the *all-gather output* ``all_gather_outputs[0]``: this parameter's slice of every rank, padded, flat;
- the *unsharded parameter*: an ``nn.Parameter`` over the all-gather output with the original shape, registered
  while the module runs; an autograd leaf.

The unsharded parameter is built once. Resharding frees its storage (``resize_(0)``) and unsharding refills it in
place, so views autograd saved in forward stay valid when backward gathers again (torch's [Note: FSDP and
autograd]).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

import torch
from torch import nn

from pt_dist.fsdp._fully_shard._fsdp_api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from pt_dist.fsdp._fully_shard._fsdp_common import (
    FSDPMeshInfo,
    HSDPMeshInfo,
    _chunk_with_empty,
    _get_dim_chunked_size,
    _to_dtype_if_needed,
)

__all__ = ["FSDPParam", "ParamModuleInfo", "ShardedState", "alloc_storage", "free_storage"]


class ShardedState(Enum):
    SHARDED = auto()  # the sharded parameter is registered; the only parameter memory
    UNSHARDED = auto()  # the unsharded parameter is registered; both hold memory


@dataclass
class ParamModuleInfo:
    """Where a parameter is registered (``setattr(module, param_name, ...)``), plus where else it is shared."""

    module: nn.Module
    param_name: str
    shared_modules: list[nn.Module] = field(default_factory=list)
    shared_param_names: list[str] = field(default_factory=list)


def _placements(mesh_info: FSDPMeshInfo) -> tuple:
    from pt_dist.tensor import Replicate, Shard

    return (Replicate(), Shard(0)) if isinstance(mesh_info, HSDPMeshInfo) else (Shard(0),)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor itself (not a copy), or a plain tensor as it is."""
    local = getattr(tensor, "_local_tensor", None)
    return tensor if local is None else local


class FSDPParam:
    """Manages one parameter's sharded, all-gather and unsharded tensors (dim-0 per-parameter sharding)."""

    dtensor_param_class: type | None = None  # for DTensor (tensor-parallel) parameters: _compat/fsdp/tensor_parallel.py

    def __new__(cls, param: nn.Parameter, *args, **kwargs):
        return super().__new__(cls.dtensor_param_class if getattr(param, "_local_tensor", None) is not None else cls)

    def __init__(self, param: nn.Parameter, module_info: ParamModuleInfo, mesh_info: FSDPMeshInfo,
                 post_forward_mesh_info: FSDPMeshInfo | None, device: torch.device,
                 mp_policy: MixedPrecisionPolicy, offload_policy: OffloadPolicy):
        self._module_info = module_info
        self.mesh_info = mesh_info
        self.post_forward_mesh_info = post_forward_mesh_info
        self.device = device
        self.mp_policy = mp_policy
        self.offload_to_cpu = isinstance(offload_policy, CPUOffloadPolicy)
        self.pin_memory = self.offload_to_cpu and offload_policy.pin_memory and device.type != "cpu"
        self.all_gather_outputs: list[torch.Tensor] = []
        self._param_fqn: str | None = None  # set by the root's lazy init, for messages
        self._init_sharded_param(param)
        self._post_load_hook_handle = module_info.module.register_load_state_dict_post_hook(
            lambda *args, **kwargs: self.reset_sharded_param())

    @torch.no_grad()
    def _init_sharded_param(self, param: nn.Parameter) -> None:
        if param.device != self.device and param.device.type != "meta":
            raise AssertionError(f"Expects the parameter to already be moved to device {self.device} but got "
                                 f"{param.device}")
        if not param.is_contiguous():
            raise NotImplementedError(f"FSDP does not support non-contiguous parameters yet: {param.shape=} "
                                      f"{param.stride()=}")
        shard_rank, shard_world_size = self.mesh_info.shard_mesh_rank, self.mesh_info.shard_mesh_size
        self._orig_size = param.size()
        self._contiguous_orig_stride = torch.empty(self._orig_size, device="meta").stride()
        chunks = _chunk_with_empty(param, shard_world_size, dim=0)
        sharded_param = chunks[shard_rank]
        self.sharded_size = _get_dim_chunked_size(sharded_param, param.size(), dim=0)
        self.contiguous_sharded_stride = torch.empty(self.sharded_size, device="meta").stride()
        self.padded_sharded_param_size = chunks[0].size()  # the 0th chunk is the longest
        padded = param.new_zeros(self.padded_sharded_param_size)
        if sharded_param.numel() > 0:
            padded.narrow(0, 0, sharded_param.size(0)).copy_(sharded_param)
        if self.offload_to_cpu and not padded.is_meta:
            padded = padded.cpu()
            if self.pin_memory:
                padded = padded.pin_memory()
        self._sharded_param_data = padded.view(-1)
        length = sharded_param.size(0) if sharded_param.numel() > 0 else 0
        self.sharded_param = nn.Parameter(self.to_sharded_dtensor(padded.narrow(0, 0, length)),
                                          requires_grad=param.requires_grad)
        self._setattr_on_modules(self.sharded_param)  # the original parameter is freed with its last reference
        self.sharded_state = ShardedState.SHARDED

    def init_dtype_attrs(self, mp_policy: MixedPrecisionPolicy) -> None:
        param_dtype, reduce_dtype = mp_policy.param_dtype, mp_policy.reduce_dtype
        self.orig_dtype = self.sharded_param.dtype
        if param_dtype == self.orig_dtype or not self.orig_dtype.is_floating_point:
            param_dtype = None  # no cast needed
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype

    @property
    def unsharded_grad_dtype(self) -> torch.dtype:
        """The dtype gradients are reduced and accumulated in: ``reduce_dtype``, else the original dtype."""
        return self.reduce_dtype if self.reduce_dtype is not None else self.orig_dtype

    # -- all-gather ----------------------------------------------------------------------------------------------

    @property
    def all_gather_inputs(self) -> list[torch.Tensor]:  # 1-D, padded
        data = self._sharded_param_data
        if self.offload_to_cpu:
            data = data.to(self.device, non_blocking=True)
        return [_to_dtype_if_needed(data, self.param_dtype)]

    def init_all_gather_outputs(self, numels: list[int], dtypes: list[torch.dtype], world_size: int,
                                device: torch.device) -> None:
        if self.all_gather_outputs:
            return  # built once: the unsharded parameter is a view of it
        self.all_gather_outputs = [torch.empty(numel * world_size, dtype=dtype, device=device)
                                   for numel, dtype in zip(numels, dtypes)]

    def alloc_all_gather_outputs(self) -> None:
        for tensor in self.all_gather_outputs:
            alloc_storage(tensor)

    def free_unsharded_param(self) -> None:
        for tensor in self.all_gather_outputs:
            free_storage(tensor)

    def init_unsharded_param(self) -> None:
        if hasattr(self, "_unsharded_param"):
            return  # after the first all-gather: the storage was refilled in place
        unsharded = torch.as_strided(self.all_gather_outputs[0], self._orig_size, self._contiguous_orig_stride,
                                     storage_offset=0)
        self._unsharded_param = nn.Parameter(unsharded, requires_grad=self.sharded_param.requires_grad)
        self._unsharded_param.grad_dtype = self.unsharded_grad_dtype

    @property
    def unsharded_param(self) -> nn.Parameter:
        return self._unsharded_param

    @property
    def unsharded_grad_data(self) -> torch.Tensor:
        return self._unsharded_param.grad

    # -- registration ---------------------------------------------------------------------------------------------

    def to_sharded(self) -> None:
        self._setattr_on_modules(self.sharded_param)
        self.free_unsharded_param()
        self.sharded_state = ShardedState.SHARDED

    def to_unsharded(self) -> None:
        if self.sharded_param.requires_grad != self._unsharded_param.requires_grad:
            self._unsharded_param.requires_grad_(self.sharded_param.requires_grad)
        self._setattr_on_modules(self._unsharded_param)
        self.sharded_state = ShardedState.UNSHARDED

    def _setattr_on_modules(self, param: nn.Parameter) -> None:
        unsafe_setattr_param(self._module_info.module, self._module_info.param_name, param)
        for module, name in zip(self._module_info.shared_modules, self._module_info.shared_param_names):
            unsafe_setattr_param(module, name, param)

    def to_sharded_dtensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """A local shard (of the parameter or its gradient) as a ``DTensor`` of the parameter's global shape."""
        if tensor.shape != self.sharded_size:
            raise AssertionError(f"Expects size {self.sharded_size} but got {tensor.shape}")
        from pt_dist.tensor import DTensor

        return DTensor.from_local(tensor, self.mesh_info.mesh, _placements(self.mesh_info), run_check=False,
                                  shape=self._orig_size, stride=self._contiguous_orig_stride)

    @torch.no_grad()
    def reset_sharded_param(self) -> None:
        """Re-point ``_sharded_param_data`` at the registered parameter's local tensor after someone replaced it
        (``load_state_dict``, ``module.to(dtype)``), padding it again (torch's ``reset_sharded_param``)."""
        module_info = self._module_info
        new_param = getattr(module_info.module, module_info.param_name)
        if new_param is not self.sharded_param:
            self.sharded_param = new_param
        local_tensor = _local(new_param)
        if local_tensor.is_meta:
            return
        same = (self._sharded_param_data.untyped_storage().data_ptr() == local_tensor.untyped_storage().data_ptr()
                and self._sharded_param_data.dtype == local_tensor.dtype)
        if same:
            return
        length = local_tensor.size(0) if local_tensor.numel() > 0 else 0
        padded = local_tensor.new_zeros(self.padded_sharded_param_size)
        padded.narrow(0, 0, length).copy_(local_tensor)
        self._sharded_param_data = padded.view(-1)
        new_param._local_tensor = padded.narrow(0, 0, length)

    def __repr__(self) -> str:
        return f"FSDPParam(fqn={self._param_fqn}, orig_size={self._orig_size})"


def alloc_storage(tensor: torch.Tensor) -> None:
    size = tensor.numel() * tensor.itemsize
    if (storage := tensor.untyped_storage()).size() != size:
        storage.resize_(size)


def free_storage(tensor: torch.Tensor) -> None:
    if (storage := tensor.untyped_storage()).size() != 0:
        storage.resize_(0)


def unsafe_setattr_param(module: nn.Module, param_name: str, param: nn.Parameter) -> None:
    """Register without ``nn.Module.__setattr__``'s checks (fast path) unless the module overrides it."""
    if getattr(module.__setattr__, "__func__", None) is nn.Module.__setattr__:
        module._parameters[param_name] = param
    else:
        setattr(module, param_name, param)
