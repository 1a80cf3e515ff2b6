"""``deepspeed.runtime.zero``: the ZeRO-3 user helpers of the core (``Init``, with DeepSpeed's signature, is
``ds_zero.zero.Init``: importing it here would close a cycle, since it is built over this package)."""

from ds_zero.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

__all__ = ["GatheredParameters", "ZeroParamStatus"]
