"""``deepspeed.add_config_arguments``; it lives in :mod:`ds_zero._compat.arguments`."""

from ds_zero._compat.arguments import add_config_arguments, config_from_args

__all__ = ["add_config_arguments", "config_from_args"]
