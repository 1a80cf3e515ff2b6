"""vLLM's ``distributed/communication_op.py`` path: the TP collectives (``parallel_state.py``)."""

from paged_serve.distributed.parallel_state import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_gather,
)

__all__ = ["tensor_model_parallel_all_gather", "tensor_model_parallel_all_reduce", "tensor_model_parallel_gather"]
