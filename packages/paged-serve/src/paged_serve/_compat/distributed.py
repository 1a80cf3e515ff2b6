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

from paged_serve.distributed.parallel_state import destroy_model_parallel

logger = logging.getLogger(__name__)


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    gc.collect()  # a deleted LLM caught in a reference cycle: its engine shuts down now
    destroy_model_parallel()
    if shutdown_ray:
        logger.info("cleanup_dist_env_and_memory(shutdown_ray=True): paged_serve runs no Ray; nothing to stop")
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
