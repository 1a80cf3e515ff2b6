"""``deepspeed.checkpoint.utils``."""

from ds_zero._compat.checkpoint import clone_tensors_for_torch_save

__all__ = ["clone_tensors_for_torch_save"]
