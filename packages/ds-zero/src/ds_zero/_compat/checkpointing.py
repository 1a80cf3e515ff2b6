"""``deepspeed.checkpointing.configure`` as DeepSpeed's callers use it: ``deepspeed_config`` may also be a config
dict or a JSON path, and the config file's key names (``contiguous_memory_optimization``,
``number_checkpoints``) are accepted as keywords. ``model_parallel_cuda_manual_seed(seed)`` with DeepSpeed's
signature: the tensor-parallel rank comes from the mpu given to ``configure``."""

from __future__ import annotations

import os
import types

from ds_zero.runtime.activation_checkpointing import checkpointing, rng
from ds_zero.runtime.config import parse_activation_checkpointing, read_config


def configure(mpu_=None, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None,
              contiguous_memory_optimization=None, number_checkpoints=None) -> None:
    if isinstance(deepspeed_config, (dict, str, os.PathLike)):  # only its activation_checkpointing section matters
        section = read_config(deepspeed_config).get("activation_checkpointing", {})
        deepspeed_config = types.SimpleNamespace(activation_checkpointing=parse_activation_checkpointing(section))
    if contiguous_checkpointing is None:
        contiguous_checkpointing = contiguous_memory_optimization
    if num_checkpoints is None:
        num_checkpoints = number_checkpoints
    checkpointing.configure(mpu_, deepspeed_config, partition_activations, contiguous_checkpointing, num_checkpoints,
                            checkpoint_in_cpu, synchronize, profile)


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the default stream with ``seed`` and the tracked model-parallel stream with ``seed + 2718 + tp_rank``,
    ``tp_rank`` from the configured mpu. Without one DeepSpeed fails (it logs ``mpu.get_data_parallel_rank()``);
    here that is an error on every rank, raised before any generator is touched."""
    mpu = checkpointing._STATE.mpu
    if mpu is None:
        raise AttributeError("model_parallel_cuda_manual_seed needs a model-parallel unit: call "
                             "deepspeed.checkpointing.configure(mpu_, ...) first (DeepSpeed reads "
                             "mpu.get_data_parallel_rank() here and fails without one)")
    get_rank = getattr(mpu, "get_tensor_model_parallel_rank", None) or mpu.get_model_parallel_rank
    rng.model_parallel_cuda_manual_seed(seed, get_rank())
