"""``deepspeed.accelerator.real_accelerator``: the process-wide choice."""

from ds_zero._compat.accelerator import (
                                         SUPPORTED_ACCELERATOR_LIST,
                                         get_accelerator,
                                         is_current_accelerator_supported,
                                         set_accelerator,
)

__all__ = ["SUPPORTED_ACCELERATOR_LIST", "get_accelerator", "is_current_accelerator_supported", "set_accelerator"]
