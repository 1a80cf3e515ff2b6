"""DTensor factories (torch's ``zeros`` / ``ones`` / ``empty`` / ``full`` / ``rand`` / ``randn`` / ``linspace`` /
``logspace`` in ``tensor/_api.py``): each rank makes only its local shard of the global ``size``; nothing is
communicated. ``linspace`` / ``logspace`` start each shard at its global offset's value; ``rand`` / ``randn`` draw a
shard from the rank's own generator, as torch's random fills on a CPU mesh (``random_ops.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pt_dist.device_mesh import _mesh_resources
from pt_dist.tensor._api import DTensor
from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta
from pt_dist.tensor._utils import _local_shape_and_offset, normalize_placements
from pt_dist.tensor.placement_types import Placement, Replicate

__all__ = ["empty", "full", "linspace", "logspace", "ones", "rand", "randn", "zeros"]


def _size(size) -> torch.Size:
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = size[0]
    return torch.Size(size)


def _plain(op):
    """A factory that needs only the local shape."""
    return lambda shape, offset, **kw: op(shape, **kw)


def _init(make, size, device_mesh, placements, dtype, layout, requires_grad, what: str) -> DTensor:
    device_mesh = device_mesh or _mesh_resources.get_current_mesh()
    if layout != torch.strided:
        raise ValueError(f"{what}: layout {layout} is not supported (torch.strided only)")
    placements = normalize_placements(placements or [Replicate()] * device_mesh.ndim, len(size), device_mesh.ndim,
                                      what)
    coordinate = device_mesh.get_coordinate()
    if coordinate is None:
        raise NotImplementedError(f"{what}: rank {device_mesh.get_rank()} is not in {device_mesh}")
    local_shape, offset = _local_shape_and_offset(size, device_mesh.shape, coordinate, placements)
    local = make(local_shape, offset, dtype=dtype, device=device_mesh.device_type)
    stride = torch._prims_common.make_contiguous_strides_for(size)
    spec = DTensorSpec(device_mesh, placements, TensorMeta(size, tuple(stride), local.dtype))
    return DTensor(local.requires_grad_(requires_grad), spec, requires_grad=requires_grad)


def zeros(*size, requires_grad: bool = False, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
          device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(_plain(torch.zeros), _size(size), device_mesh, placements, dtype, layout, requires_grad, "zeros")


def ones(*size, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
         device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(_plain(torch.ones), _size(size), device_mesh, placements, dtype, layout, requires_grad, "ones")


def empty(*size, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided, requires_grad: bool = False,
          device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(_plain(torch.empty), _size(size), device_mesh, placements, dtype, layout, requires_grad, "empty")


def full(size, fill_value, *, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
         requires_grad: bool = False, device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    def make(shape, offset, **kw):
        return torch.full(shape, fill_value, **kw)

    return _init(make, torch.Size(size), device_mesh, placements, dtype, layout, requires_grad, "full")


def rand(*size, requires_grad: bool = False, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
         device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(_plain(torch.rand), _size(size), device_mesh, placements, dtype, layout, requires_grad, "rand")


def randn(*size, requires_grad: bool = False, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
          device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    return _init(_plain(torch.randn), _size(size), device_mesh, placements, dtype, layout, requires_grad, "randn")


def _spaced(op, start, end, steps: int, what: str, **kw):
    """The local run of ``op(start, end, steps)``: this shard's first and last values from its global offset."""
    for v in (start, end):
        if isinstance(v, torch.Tensor) and v.dim() != 0:
            raise RuntimeError(f"{what} only supports 0-dimensional start and end tensors")
    start, end = (v.item() if isinstance(v, torch.Tensor) else v for v in (start, end))

    def make(shape, offset, **factory):
        n, step = shape[0], (end - start) / (steps - 1) if steps > 1 else 0.0
        first = start + offset[0] * step if n > 0 else start
        return op(first, first + step * (n - 1) if n > 1 else first, steps=n, **kw, **factory)

    return make


def linspace(start, end, steps, *, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
             requires_grad: bool = False, device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    make = _spaced(torch.linspace, start, end, steps, "linspace")
    return _init(make, torch.Size((steps,)), device_mesh, placements, dtype, layout, requires_grad, "linspace")


def logspace(start, end, steps, base=10.0, *, dtype: torch.dtype | None = None, layout: torch.layout = torch.strided,
             requires_grad: bool = False, device_mesh=None, placements: Sequence[Placement] | None = None) -> DTensor:
    make = _spaced(torch.logspace, start, end, steps, "logspace", base=base)
    return _init(make, torch.Size((steps,)), device_mesh, placements, dtype, layout, requires_grad, "logspace")
