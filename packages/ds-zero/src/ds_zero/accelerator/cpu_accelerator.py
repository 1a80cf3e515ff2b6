"""``deepspeed.accelerator.cpu_accelerator``."""

from ds_zero._compat.accelerator import CPU_Accelerator

__all__ = ["CPU_Accelerator"]
