"""``deepspeed.accelerator.abstract_accelerator``."""

from ds_zero._compat.accelerator import DeepSpeedAccelerator

__all__ = ["DeepSpeedAccelerator"]
