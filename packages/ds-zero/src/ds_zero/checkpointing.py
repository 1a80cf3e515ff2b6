"""``ds_zero.checkpointing``: activation checkpointing, as ``deepspeed.checkpointing``."""

from ds_zero._compat.checkpointing import configure
from ds_zero.runtime.activation_checkpointing import checkpointing  # noqa: F401 - the module, for its state
from ds_zero.runtime.activation_checkpointing.checkpointing import (
    CheckpointFunction,
    checkpoint,
    get_cuda_rng_tracker,
    host_pool,
    is_configured,
    model_parallel_cuda_manual_seed,
    reset,
)

__all__ = ["CheckpointFunction", "checkpoint", "configure", "get_cuda_rng_tracker", "host_pool", "is_configured",
           "model_parallel_cuda_manual_seed", "reset"]
