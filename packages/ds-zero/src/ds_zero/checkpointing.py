"""``ds_zero.checkpointing``: activation checkpointing, as ``deepspeed.checkpointing``."""

from ds_zero._compat.checkpointing import configure, model_parallel_cuda_manual_seed
from ds_zero.runtime.activation_checkpointing import checkpointing  # noqa: F401 - the module, for its state
from ds_zero.runtime.activation_checkpointing.checkpointing import (
    CheckpointFunction,
    CudaRNGStatesTracker,
    checkpoint,
    get_cuda_rng_tracker,
    host_pool,
    is_configured,
    reset,
)

__all__ = ["CheckpointFunction", "CudaRNGStatesTracker", "checkpoint", "configure", "get_cuda_rng_tracker", "host_pool",
           "is_configured", "model_parallel_cuda_manual_seed", "reset"]
