"""``deepspeed.accelerator.cuda_accelerator``."""

from ds_zero._compat.accelerator import CUDA_Accelerator

__all__ = ["CUDA_Accelerator"]
