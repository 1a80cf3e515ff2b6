"""``deepspeed.accelerator``: ``get_accelerator()`` and the interface (:mod:`ds_zero._compat.accelerator`)."""

from ds_zero._compat.accelerator import (
                                         DeepSpeedAccelerator,
                                         get_accelerator,
                                         is_current_accelerator_supported,
                                         set_accelerator,
)

__all__ = ["DeepSpeedAccelerator", "get_accelerator", "is_current_accelerator_supported", "set_accelerator"]
