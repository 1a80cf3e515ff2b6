"""``ds_zero.utils``: what DeepSpeed's scripts import from ``deepspeed.utils``."""

from ds_zero._compat.dataloader import RepeatingLoader
from ds_zero._compat.init_on_device import OnDevice
from ds_zero._compat.logging import log_dist, logger, print_json_dist
from ds_zero._compat.nvtx import instrument_w_nvtx
from ds_zero._compat.tensor_fragment import (
    safe_get_full_fp32_param,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_optimizer_state,
)
from ds_zero.utils import groups, zero_to_fp32

__all__ = ["OnDevice", "RepeatingLoader", "groups", "instrument_w_nvtx", "log_dist", "logger", "print_json_dist",
           "safe_get_full_fp32_param", "safe_get_full_optimizer_state", "safe_get_local_fp32_param",
           "safe_get_local_optimizer_state", "safe_set_full_fp32_param", "safe_set_full_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_optimizer_state", "zero_to_fp32"]
