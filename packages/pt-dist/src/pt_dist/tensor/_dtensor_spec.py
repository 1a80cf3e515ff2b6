"""What a DTensor is besides its local tensor (torch's ``tensor/_dtensor_spec.py``): the mesh, one placement per
mesh dim, and the global shape/stride/dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from pt_dist.tensor.placement_types import Placement, Shard

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
    def device_mesh(self):
        return self.mesh

    @property
    def shape(self) -> torch.Size:
        return self.tensor_meta.shape

    @property
    def stride(self) -> tuple[int, ...]:
        return self.tensor_meta.stride

    @property
    def ndim(self) -> int:
        return len(self.tensor_meta.shape)

    @property
    def num_shards(self) -> int:
        n = 1
        for i, p in enumerate(self.placements):
            if isinstance(p, Shard):
                n *= self.mesh.size(i)
        return n

    @property
    def dim_map(self) -> list[int]:
        """For every tensor dim, the mesh dim sharding it (-1: none; torch's, refuses nested shards)."""
        out = [-1] * self.ndim
        for i, p in enumerate(self.placements):
            if isinstance(p, Shard):
                if out[p.dim] != -1:
                    raise ValueError(f"tensor dim {p.dim} is sharded on mesh dims {out[p.dim]} and {i}")
                out[p.dim] = i
        return out

    def is_replicated(self) -> bool:
        return all(p.is_replicate() for p in self.placements)

    def is_sharded(self) -> bool:
        return any(p.is_shard() for p in self.placements)

    def __str__(self) -> str:
        return f"Spec({''.join(str(p) for p in self.placements)} on {tuple(self.shape)})"
