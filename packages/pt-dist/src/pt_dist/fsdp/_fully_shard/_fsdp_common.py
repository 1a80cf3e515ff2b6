"""What FSDP2's files share: the data-parallel mesh infos (which mesh dim shards, which replicates), the training
states, and small tensor helpers (torch's torch/distributed/fsdp/_fully_shard/_fsdp_common.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum, auto

import torch

__all__ = ["DDPMeshInfo", "DataParallelMeshInfo", "FSDPMeshInfo", "HSDPMeshInfo", "TrainingState"]


@dataclass
class DataParallelMeshInfo:
    mesh: object  # a pt_dist.device_mesh.DeviceMesh
    shard_mesh_dim: int | None = None
    replicate_mesh_dim: int | None = None

    def __post_init__(self):
        if self.shard_mesh_dim is None and self.replicate_mesh_dim is None:
            raise AssertionError("At least one of shard_mesh_dim and replicate_mesh_dim must not be None")


@dataclass
class FSDPMeshInfo(DataParallelMeshInfo):
    """The mesh dim parameters are sharded over: its pt_dist group, size and this rank's index in it."""

    def __post_init__(self):
        super().__post_init__()
        if self.shard_mesh_dim is None:
            raise AssertionError("Expects non-None shard_mesh_dim")
        self.shard_mesh_size: int = self.mesh.size(self.shard_mesh_dim)
        self.shard_process_group = self.mesh.get_group(self.shard_mesh_dim)
        self.shard_mesh_rank: int = self.shard_process_group.rank()


@dataclass
class DDPMeshInfo(DataParallelMeshInfo):
    """The mesh dim parameters are replicated over (HSDP's outer dim): gradients are all-reduced there."""

    def __post_init__(self):
        super().__post_init__()
        if self.replicate_mesh_dim is None:
            raise AssertionError("Expects non-None replicate_mesh_dim")
        self.replicate_mesh_size: int = self.mesh.size(self.replicate_mesh_dim)
        self.replicate_process_group = self.mesh.get_group(self.replicate_mesh_dim)
        self.replicate_mesh_rank: int = self.replicate_process_group.rank()


@dataclass
class HSDPMeshInfo(FSDPMeshInfo, DDPMeshInfo):
    """A 2-D mesh: replicate on dim 0, shard on dim 1."""

    def __post_init__(self):  # both parents' checks, through the MRO
        super().__post_init__()


class TrainingState(Enum):
    FORWARD = auto()
    PRE_BACKWARD = auto()
    POST_BACKWARD = auto()
    IDLE = auto()


def _get_dim0_padded_size(tensor_size: torch.Size, dim0_factor: int) -> torch.Size:
    padded_dim0 = math.ceil(tensor_size[0] / dim0_factor) * dim0_factor
    return torch.Size([padded_dim0]) + tensor_size[1:]


def _chunk_with_empty(tensor: torch.Tensor, num_chunks: int, dim: int) -> list[torch.Tensor]:
    """torch.chunk, padded with empty chunks to ``num_chunks`` (dim 0 of 3 over 4 ranks: 1, 1, 1, 0 rows)."""
    chunks = list(torch.chunk(tensor, num_chunks, dim=dim))
    while len(chunks) < num_chunks:
        chunks.append(chunks[0].new_empty(0))
    return chunks


def _get_dim_chunked_size(chunk: torch.Tensor, unchunked_size: torch.Size, dim: int) -> torch.Size:
    if chunk.numel() > 0:
        return chunk.size()
    return unchunked_size[:dim] + torch.Size([0]) + unchunked_size[dim + 1:]


def _to_dtype_if_needed(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is not None and tensor.dtype != dtype:
        return tensor.to(dtype)
    return tensor


def _cast_fp_tensor(dtype: torch.dtype, x):
    if not isinstance(x, torch.Tensor) or not torch.is_floating_point(x) or x.dtype == dtype:
        return x
    return x.to(dtype)


def is_bw() -> bool:
    """Whether autograd's engine is running a backward on this thread (a forward re-run by checkpointing)."""
    return torch._C._current_graph_task_id() != -1
