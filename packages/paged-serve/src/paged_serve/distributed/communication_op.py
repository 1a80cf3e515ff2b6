"""vLLM's ``distributed/communication_op.py`` path: the TP collectives by their module-level names."""

from paged_serve._compat.distributed import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_gather,
)

__all__ = ["tensor_model_parallel_all_gather", "tensor_model_parallel_all_reduce", "tensor_model_parallel_gather"]
