"""``deepspeed.runtime.zero`` (``deepspeed.zero`` is this package): the ZeRO-3 user helpers."""

from ds_zero._compat.zero_init import Init
from ds_zero.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus"]
