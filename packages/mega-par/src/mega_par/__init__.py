"""mega_par: Megatron-LM's core rebuilt small on torch.distributed.

Parallel state (the MPU), tensor/sequence parallel layers, a GPT model, pipeline schedules,
data parallelism with a distributed optimizer, 3D training and checkpoint conversion to Hugging Face.
"""

from mega_par import parallel_state, tensor_parallel
from mega_par.distributed import DistributedDataParallel
from mega_par.model_parallel_config import ModelParallelConfig

__version__ = "0.1.0"

__all__ = ["DistributedDataParallel", "ModelParallelConfig", "parallel_state", "tensor_parallel"]
