"""``ds_zero.zero``: the user-facing ZeRO-3 helpers, as in ``deepspeed.zero``."""

from ds_zero.runtime.zero.partition_parameters import GatheredParameters, Init, ZeroParamStatus

__all__ = ["GatheredParameters", "Init", "ZeroParamStatus"]
