"""FSDP2 over tensor parallelism (torch's 2-D parallelism: ``fully_shard(model, mesh=mesh["dp"])`` after
``parallelize_module(model, mesh["tp"], plan)``; torch's ``FSDPParam`` with a ``_tp_spec``).

A tensor-parallel parameter is a DTensor on the tp mesh; FSDP shards this rank's TP-local tensor on dim 0 across
the dp mesh, exactly as it shards a plain parameter, and gathers it back into a TP DTensor for forward. Between
iterations the parameter (and its gradient) is a DTensor on the 2-D mesh ``(tp, dp)`` with placements
``(<TP placement>, Shard(0))``: the tp dim cuts first and the dp dim cuts what it left, which is the layout torch
writes as ``(_StridedShard(0, split_factor=tp), Shard(0))`` on ``(dp, tp)`` for a ``Shard(0)`` TP parameter (and
``(Shard(0), <TP placement>)`` for the others); with the tp dim first, pt_dist's ordinary nested shards describe
it, so ``full_tensor``, ``redistribute`` and checkpoint offsets need nothing new. Before the reduce-scatter a
TP gradient is brought to the parameter's TP placements (a Partial one all-reduced over tp)."""

from __future__ import annotations

import torch
from torch import nn

from pt_dist.device_mesh import DeviceMesh
from pt_dist.fsdp._fully_shard._fsdp_common import HSDPMeshInfo
from pt_dist.fsdp._fully_shard._fsdp_param import FSDPParam
from pt_dist.tensor._api import DTensor
from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor.placement_types import Shard

__all__ = ["TensorParallelFSDPParam"]


def _tp_dp_mesh(tp_mesh: DeviceMesh, dp_mesh: DeviceMesh) -> DeviceMesh:
    """The 2-D mesh ``(tp, dp)`` through this rank, from the two 1-D meshes' strides in the root mesh (as
    ``init_device_mesh`` lays it out), over their groups (no new group)."""
    rank = dp_mesh.get_rank()
    (t,), (d,) = tp_mesh.get_coordinate(), dp_mesh.get_coordinate()
    (ts,), (ds,) = tp_mesh._strides, dp_mesh._strides
    ranks = [[rank + (i - t) * ts + (j - d) * ds for j in range(dp_mesh.size())] for i in range(tp_mesh.size())]
    names = None
    if tp_mesh.mesh_dim_names and dp_mesh.mesh_dim_names:
        names = (tp_mesh.mesh_dim_names[0], dp_mesh.mesh_dim_names[0])
    return DeviceMesh(tp_mesh.device_type, ranks, mesh_dim_names=names, _init_backend=False, _rank=rank,
                      _dim_groups=[tp_mesh.get_group(0), dp_mesh.get_group(0)])


class TensorParallelFSDPParam(FSDPParam):
    """``FSDPParam`` for a parameter that is a DTensor on a 1-D tp mesh."""

    def _init_sharded_param(self, param: nn.Parameter) -> None:
        if isinstance(self.mesh_info, HSDPMeshInfo):
            raise NotImplementedError("fully_shard: HSDP over tensor-parallel parameters is not supported by "
                                      f"pt_dist (mesh {self.mesh_info.mesh})")
        if param.device_mesh.ndim != 1:
            raise NotImplementedError(f"fully_shard: a DTensor parameter must be on a 1-D (tp) mesh, got "
                                      f"{param.device_mesh}")
        self._tp_spec = param._spec
        self._spanned_mesh = _tp_dp_mesh(param.device_mesh, self.mesh_info.mesh)
        super()._init_sharded_param(nn.Parameter(param._local_tensor, requires_grad=param.requires_grad))

    def to_sharded_dtensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.shape != self.sharded_size:
            raise AssertionError(f"Expects size {self.sharded_size} but got {tensor.shape}")
        spec = self._tp_spec
        return DTensor.from_local(tensor, self._spanned_mesh, (*spec.placements, Shard(0)), run_check=False,
                                  shape=spec.shape, stride=spec.stride)

    def init_unsharded_param(self) -> None:
        if hasattr(self, "_unsharded_param"):
            return
        super().init_unsharded_param()
        local, spec = self._unsharded_param.data, self._tp_spec
        meta = TensorMeta(spec.shape, spec.stride, local.dtype)
        requires_grad = self._unsharded_param.requires_grad
        unsharded = DTensor(local, DTensorSpec(spec.mesh, spec.placements, meta), requires_grad=requires_grad)
        self._unsharded_param = nn.Parameter(unsharded, requires_grad=requires_grad)
        self._unsharded_param.grad_dtype = self.unsharded_grad_dtype

    @property
    def unsharded_grad_data(self) -> torch.Tensor:
        grad = self._unsharded_param.grad
        if grad.placements != self._tp_spec.placements:
            with torch.no_grad():
                grad = grad.redistribute(placements=self._tp_spec.placements)
        return grad._local_tensor


FSDPParam.dtensor_param_class = TensorParallelFSDPParam
