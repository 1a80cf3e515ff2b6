"""``ModelParallelConfig``: the parallel layout, precision and pipeline hooks every Megatron module reads
(``megatron/core/model_parallel_config.py``); ``TransformerConfig`` extends it.

The sizes here describe the layout to the modules (and are checked against each other as Megatron checks
them); the process groups themselves come from ``parallel_state.initialize_model_parallel``. Fields of
Megatron's config that mega_par has no mechanism for are accepted only at Megatron's default: another value
raises a ValueError naming the field. A name Megatron does not have is a TypeError, as for any dataclass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Megatron fields with no mega_par mechanism -> the only value accepted (Megatron's default)
_MODEL_PARALLEL_NOT_IMPLEMENTED = {
    "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None, "timers": None,
    "grad_sync_func": None, "param_sync_func": None, "gradient_accumulation_fusion": False,
    "tp_comm_overlap": False, "overlap_p2p_comm": False, "batch_p2p_comm": True,
    "defer_embedding_wgrad_compute": False, "enable_autocast": False, "autocast_dtype": None,
    "use_te_rng_tracker": False, "cpu_offloading": False,
}


def refuse_unimplemented(config, table: dict) -> None:
    for name, default in table.items():
        value = getattr(config, name)
        if value != default:
            raise ValueError(f"{type(config).__name__}.{name}={value!r} is not implemented in mega_par "
                             f"(only Megatron's default {default!r} is accepted)")


@dataclass
class ModelParallelConfig:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    sequence_parallel: bool = False
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    # initialisation: every parallel layer draws the full weight and keeps its slice, i.e. Megatron's
    # use_cpu_initialization=True path, whatever this flag says (so sharded == unsharded under one seed)
    perform_initialization: bool = True
    use_cpu_initialization: bool = False
    # precision: params_dtype is what the modules allocate; fp16/bf16 record the mixed-precision mode
    fp16: bool = False
    bf16: bool = False
    params_dtype: torch.dtype = torch.float32
    timers: Callable | None = None
    # hooks the schedules call (Megatron's training sets them; None: the schedule does not)
    finalize_model_grads_func: Callable | None = None
    grad_scale_func: Callable | None = None
    no_sync_func: Callable | None = None
    grad_sync_func: Callable | None = None
    param_sync_func: Callable | None = None
    deterministic_mode: bool = False
    gradient_accumulation_fusion: bool = False
    tp_comm_overlap: bool = False
    cross_entropy_loss_fusion: bool = False  # a fused kernel for the same loss: accepted, same result
    # pipeline
    pipeline_dtype: torch.dtype | None = None  # dtype of the activations sent between stages
    variable_seq_lengths: bool = False  # exchange activation shapes before each p2p message
    overlap_p2p_comm: bool = False
    batch_p2p_comm: bool = True
    deallocate_pipeline_outputs: bool = False  # free a stage output's data once sent (Megatron's training sets it)
    defer_embedding_wgrad_compute: bool = False
    enable_autocast: bool = False
    autocast_dtype: torch.dtype | None = None
    barrier_with_L1_time: bool = True
    use_te_rng_tracker: bool = False
    cpu_offloading: bool = False

    def __post_init__(self):
        refuse_unimplemented(self, _MODEL_PARALLEL_NOT_IMPLEMENTED)
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.sequence_parallel and self.tensor_model_parallel_size <= 1:
            raise ValueError("Cannot use sequence parallelism without tensor parallelism "
                             f"(sequence_parallel=True, tensor_model_parallel_size={self.tensor_model_parallel_size})")
        if self.pipeline_model_parallel_size > 1 and self.pipeline_dtype is None:
            raise ValueError("When using pipeline parallelism, pipeline_dtype must be specified "
                             f"(pipeline_model_parallel_size={self.pipeline_model_parallel_size})")
        if self.fp16 and self.bf16:
            raise ValueError(f"Only one of self.fp16: {self.fp16} and self.bf16 {self.bf16} should be True.")
