"""DeepSpeed's accelerator abstraction (``deepspeed/accelerator/``), one module per DeepSpeed file: the interface,
the cpu and cuda accelerators, and the process-wide choice."""

from ds_zero._compat.accelerator.abstract_accelerator import DeepSpeedAccelerator, NotImplementedBuilder
from ds_zero._compat.accelerator.cpu_accelerator import CPU_Accelerator
from ds_zero._compat.accelerator.cuda_accelerator import CUDA_Accelerator
from ds_zero._compat.accelerator.real_accelerator import (
    SUPPORTED_ACCELERATOR_LIST,
    get_accelerator,
    is_current_accelerator_supported,
    set_accelerator,
)

__all__ = ["CPU_Accelerator", "CUDA_Accelerator", "DeepSpeedAccelerator", "NotImplementedBuilder",
           "SUPPORTED_ACCELERATOR_LIST", "get_accelerator", "is_current_accelerator_supported", "set_accelerator"]
