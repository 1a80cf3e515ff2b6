"""DeepSpeed's learning-rate schedules (``deepspeed/runtime/lr_schedules.py``); they live in
:mod:`ds_zero._compat.lr_schedules`."""

from ds_zero._compat.lr_schedules import (
    SCHEDULERS,
    WARMUP_LINEAR_RATE,
    WARMUP_LOG_RATE,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
)

__all__ = ["SCHEDULERS", "WARMUP_LINEAR_RATE", "WARMUP_LOG_RATE", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR"]
