"""vLLM's module-level names for the tensor-parallel group and its collectives (``distributed/parallel_state.py``,
``communication_op.py``), over the current ``GroupCoordinator``; the core layers use the group object itself."""

from __future__ import annotations

import torch

from paged_serve.distributed.parallel_state import get_tp_group


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return get_tp_group().all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return get_tp_group().all_gather(x, dim)


def tensor_model_parallel_gather(x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
    return get_tp_group().gather(x, dst, dim)
