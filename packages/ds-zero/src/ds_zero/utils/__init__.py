"""``ds_zero.utils``: what DeepSpeed's scripts import from ``deepspeed.utils``."""

from ds_zero._compat.dataloader import RepeatingLoader

__all__ = ["RepeatingLoader"]
