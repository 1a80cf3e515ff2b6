"""``ds_zero.zero``: the user-facing ZeRO-3 helpers, as in ``deepspeed.zero`` (``Init`` with DeepSpeed's signature:
:mod:`ds_zero._compat.zero_init`)."""

from ds_zero._compat.zero_init import Init
from ds_zero.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus"]
