"""vLLM's ``vllm.distributed``: the tensor-parallel group and its collectives."""

from paged_serve._compat.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_gather,
)
from paged_serve.distributed.parallel_state import (
    GroupCoordinator,
    cleanup_dist_env_and_memory,
    destroy_model_parallel,
    get_tp_group,
    init_distributed_environment,
)

__all__ = [
    "GroupCoordinator",
    "cleanup_dist_env_and_memory",
    "destroy_model_parallel",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "init_distributed_environment",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
    "tensor_model_parallel_gather",
]
