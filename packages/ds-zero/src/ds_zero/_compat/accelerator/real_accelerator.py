"""``deepspeed.accelerator.real_accelerator``: the process-wide choice, ``DS_ACCELERATOR`` else CUDA when a device
is visible, else cpu."""

from __future__ import annotations

import logging
import os

import torch

from ds_zero._compat.accelerator.abstract_accelerator import DeepSpeedAccelerator
from ds_zero._compat.accelerator.cpu_accelerator import CPU_Accelerator
from ds_zero._compat.accelerator.cuda_accelerator import CUDA_Accelerator

logger = logging.getLogger(__name__)

# DeepSpeed's list; ds_zero builds the first two and refuses the others by name.
SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu"]
_BUILT = ("cuda", "cpu")


ds_accelerator: DeepSpeedAccelerator | None = None


def _validate_accelerator(accel_obj) -> None:
    if not isinstance(accel_obj, DeepSpeedAccelerator):
        raise AssertionError(f"{accel_obj.__class__.__name__} accelerator is not subclass of DeepSpeedAccelerator")


def get_accelerator() -> DeepSpeedAccelerator:
    """The process's accelerator, chosen once: ``DS_ACCELERATOR``, else ``cuda`` when a CUDA device is visible,
    else ``cpu`` (DeepSpeed's ``real_accelerator.get_accelerator``)."""
    global ds_accelerator
    if ds_accelerator is not None:
        return ds_accelerator
    name = os.environ.get("DS_ACCELERATOR")
    how = "override"
    if name is not None and name not in SUPPORTED_ACCELERATOR_LIST:
        raise ValueError(f"DS_ACCELERATOR must be one of {SUPPORTED_ACCELERATOR_LIST}. Value \"{name}\" is not "
                         "supported")
    if name is not None and name not in _BUILT:
        raise ValueError(f"DS_ACCELERATOR={name!r}: ds_zero implements the {list(_BUILT)} accelerators only")
    if name is None:
        how = "auto detect"
        if torch.cuda.device_count() > 0 and torch.cuda.is_available():
            name = "cuda"
        else:
            logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to "
                           "detect it.")
            name = "cpu"
    ds_accelerator = CUDA_Accelerator() if name == "cuda" else CPU_Accelerator()
    logger.info("Setting ds_accelerator to %s (%s)", name, how)
    return ds_accelerator


def set_accelerator(accel_obj: DeepSpeedAccelerator) -> None:
    global ds_accelerator
    _validate_accelerator(accel_obj)
    ds_accelerator = accel_obj


def is_current_accelerator_supported() -> bool:
    return get_accelerator().device_name() in SUPPORTED_ACCELERATOR_LIST
