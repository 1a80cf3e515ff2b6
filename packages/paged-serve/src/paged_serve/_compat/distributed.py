"""``cleanup_dist_env_and_memory`` (vLLM ``distributed/parallel_state.py``, exported by ``vllm.distributed``).

vLLM's examples that build two ``LLM`` s in one process call it after ``del llm``: engines nothing refers to any
more are collected (``LLMEngine.__del__`` -> ``shutdown``: model, KV cache, worker processes, their groups), the
tensor-parallel group and the process group under it are left (``destroy_model_parallel``), and the CUDA caching
allocator gives its freed blocks back.
"""

from __future__ import annotations

import gc
import logging

import torch

from paged_serve.distributed.parallel_state import destroy_model_parallel, get_tp_group

logger = logging.getLogger(__name__)


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    gc.collect()  # a deleted LLM caught in a reference cycle: its engine shuts down now
    destroy_model_parallel()
    if shutdown_ray:
        logger.info("cleanup_dist_env_and_memory(shutdown_ray=True): paged_serve runs no Ray; nothing to stop")
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# vLLM's module-level names for the TP group and its collectives (communication_op.py, parallel_state.py)
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
