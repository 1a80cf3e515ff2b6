"""What a DTensor is besides its local tensor (torch's ``tensor/_dtensor_spec.py``): the mesh, one placement per
mesh dim, and the global shape/stride/dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from pt_dist.tensor.placement_types import Placement

__all__ = ["DTensorSpec", "TensorMeta"]


class TensorMeta(NamedTuple):
    shape: torch.Size
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class DTensorSpec:
    mesh: object  # DeviceMesh
    placements: tuple[Placement, ...]
    tensor_meta: TensorMeta | None = None

    @property
    def shape(self) -> torch.Size:
        return self.tensor_meta.shape

    @property
    def stride(self) -> tuple[int, ...]:
        return self.tensor_meta.stride

    @property
    def ndim(self) -> int:
        return len(self.tensor_meta.shape)

    def __str__(self) -> str:
        return f"Spec({''.join(str(p) for p in self.placements)} on {tuple(self.shape)})"
