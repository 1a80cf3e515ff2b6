"""DTensor factories (torch's ``zeros`` / ``ones`` / ``empty`` / ``full`` in ``tensor/_api.py``): each rank makes
only its local shard of the global ``size``; nothing is communicated."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pt_dist.device_mesh import _mesh_resources
from pt_dist.tensor._api import DTensor
from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._utils import _local_shape_and_offset, normalize_placements
from pt_dist.tensor.placement_types import Placement, Replicate

__all__ = ["empty", "full", "ones", "zeros"]


def _size(size) -> torch.Size:
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = size[0]
    return torch.Size(size)


def _init(make, size, device_mesh, placements, dtype, layout, requires_grad, what: str) -> DTensor:
    device_mesh = device_mesh or _mesh_resources.get_current_mesh()
    if layout != torch.strided:
        raise ValueError(f"{what}: layout {layout} is not supported (torch.strided only)")
    placements = normalize_placements(placements or [Replicate()] * device_mesh.ndim, len(size), device_mesh.ndim,
                                      what)
    coordinate = device_mesh.get_coordinate()
    if coordinate is None:
        raise NotImplementedError(f"{what}: rank {device_mesh.get_rank()} is not in {device_mesh}")
    local_shape, _ = _local_shape_and_offset(size, device_mesh.shape, coordinate, placements, skip_offset=True)
    local = make(local_shape, dtype=dtype, device=device_mesh.device_type)
    stride = torch._prims_common.make_contiguous_strides_for(size)
    spec = DTensorSpec(device_mesh, placements, TensorMeta(size, tuple(stride), local.dtype))
    return DTensor(local.requires_grad_(requires_grad), spec, requires_grad=requires_grad)


def zeros(*size, requires_grad: bool = False, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
          device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(torch.zeros, _size(size), device_mesh, placements, dtype, layout, requires_grad, "zeros")


def ones(*size, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
         device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(torch.ones, _size(size), device_mesh, placements, dtype, layout, requires_grad, "ones")


def empty(*size, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
          device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(torch.empty, _size(size), device_mesh, placements, dtype, layout, requires_grad, "empty")


def full(size, fill_value, *, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
         requires_grad: bool = False, device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    def make(shape, **kw):
        return torch.full(shape, fill_value, **kw)

    return _init(make, torch.Size(size), device_mesh, placements, dtype, layout, requires_grad, "full")
