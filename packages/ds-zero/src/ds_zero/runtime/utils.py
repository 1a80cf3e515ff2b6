"""``deepspeed/runtime/utils.py``'s ``set_random_seed``; it lives in :mod:`ds_zero._compat.runtime_utils`."""

from ds_zero._compat.runtime_utils import set_random_seed

__all__ = ["set_random_seed"]
