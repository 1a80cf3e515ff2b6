"""``ds_zero.config``: DeepSpeed's JSON config as DeepSpeed reads it (:mod:`ds_zero._compat.config`, which converts
it for the core's :mod:`ds_zero.runtime.config`)."""

from ds_zero._compat.config import DeepSpeedConfig
from ds_zero.runtime.config import ActivationCheckpointingConfig, AioConfig, FP16Config, parse_activation_checkpointing
from ds_zero.runtime.config_utils import DeepSpeedConfigError

__all__ = ["ActivationCheckpointingConfig", "AioConfig", "DeepSpeedConfig", "DeepSpeedConfigError", "FP16Config",
           "parse_activation_checkpointing"]
