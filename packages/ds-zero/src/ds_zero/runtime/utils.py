"""``deepspeed/runtime/utils.py``'s ``set_random_seed``, ``ensure_directory_exists``, ``get_global_norm``,
``empty_cache``; they live in :mod:`ds_zero._compat.runtime_utils`."""

from ds_zero._compat.runtime_utils import empty_cache, ensure_directory_exists, get_global_norm, set_random_seed

__all__ = ["empty_cache", "ensure_directory_exists", "get_global_norm", "set_random_seed"]
