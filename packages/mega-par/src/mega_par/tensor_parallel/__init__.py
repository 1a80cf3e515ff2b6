"""Tensor and sequence parallelism: communication regions, parallel layers, vocab-parallel loss, RNG."""

from mega_par.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from mega_par.tensor_parallel.data import broadcast_data
from mega_par.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_tensor_model_parallel_attributes,
    init_method_linear_default,
    init_method_normal,
    param_is_not_tensor_parallel_duplicate,
    scaled_init_method_normal,
    set_defaults_if_not_set_tensor_model_parallel_attributes,
    set_tensor_model_parallel_attributes,
)
from mega_par.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from mega_par.tensor_parallel.random import (
    CheckpointFunction,
    RNGStatesTracker,
    checkpoint,
    get_cuda_rng_tracker,
    get_rng_tracker,
    model_parallel_cuda_manual_seed,
)
from mega_par.tensor_parallel.utils import (
    VocabUtility,
    gather_split_1d_tensor,
    split_tensor_along_last_dim,
    split_tensor_into_1d_equal_chunks,
)

__all__ = [
    "CheckpointFunction", "ColumnParallelLinear", "RNGStatesTracker", "RowParallelLinear", "VocabParallelEmbedding",
    "VocabUtility", "broadcast_data", "checkpoint", "copy_tensor_model_parallel_attributes",
    "copy_to_tensor_model_parallel_region", "gather_split_1d_tensor", "gather_from_sequence_parallel_region",
    "gather_from_tensor_model_parallel_region", "get_cuda_rng_tracker", "get_rng_tracker",
    "init_method_linear_default", "init_method_normal", "model_parallel_cuda_manual_seed",
    "param_is_not_tensor_parallel_duplicate", "reduce_from_tensor_model_parallel_region",
    "reduce_scatter_to_sequence_parallel_region", "scaled_init_method_normal", "scatter_to_sequence_parallel_region",
    "scatter_to_tensor_model_parallel_region", "set_defaults_if_not_set_tensor_model_parallel_attributes",
    "set_tensor_model_parallel_attributes", "split_tensor_along_last_dim", "split_tensor_into_1d_equal_chunks",
    "vocab_parallel_cross_entropy",
]
