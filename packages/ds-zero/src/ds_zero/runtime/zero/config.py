"""The ``zero_optimization`` section (DeepSpeed's ``deepspeed/runtime/zero/config.py`` and ``offload_config.py``):
parsed in DeepSpeed's spellings by :mod:`ds_zero._compat.config`, into the core's :mod:`ds_zero.runtime.config`."""

from ds_zero._compat.config import DeepSpeedZeroConfig, parse_zero_config
from ds_zero.runtime.config import OFFLOAD_DEVICES, DeepSpeedZeroOffloadConfig, check_nvme_path

__all__ = ["OFFLOAD_DEVICES", "DeepSpeedZeroConfig", "DeepSpeedZeroOffloadConfig", "check_nvme_path",
           "parse_zero_config"]
