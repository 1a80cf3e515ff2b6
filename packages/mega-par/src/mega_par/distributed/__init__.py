"""Data parallelism: contiguous grad buffers, bucketed all-reduce / reduce-scatter, grad finalisation."""

from mega_par.distributed.distributed_data_parallel import DistributedDataParallel, DistributedDataParallelConfig
from mega_par.distributed.finalize_model_grads import finalize_model_grads
from mega_par.distributed.param_and_grad_buffer import ParamAndGradBuffer

__all__ = ["DistributedDataParallel", "DistributedDataParallelConfig", "ParamAndGradBuffer", "finalize_model_grads"]
