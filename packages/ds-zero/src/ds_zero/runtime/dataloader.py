"""``deepspeed/runtime/dataloader.py``'s ``RepeatingLoader``; it lives in :mod:`ds_zero._compat.dataloader`."""

from ds_zero._compat.dataloader import RepeatingLoader

__all__ = ["RepeatingLoader"]
