"""``ds_zero.utils``: what DeepSpeed's scripts import from ``deepspeed.utils``."""

from ds_zero._compat.dataloader import RepeatingLoader
from ds_zero.utils import groups, zero_to_fp32

__all__ = ["RepeatingLoader", "groups", "zero_to_fp32"]
