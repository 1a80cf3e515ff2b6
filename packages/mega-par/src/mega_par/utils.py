"""Helpers of ``megatron/core/utils.py`` that training loops reach for: exact division, an attribute of a model
through its wrappers (``DistributedDataParallel``, ``Float16Module``: each holds the next as ``.module``), the
model's config, a torch version check."""

from __future__ import annotations

import re

import torch


def divide(numerator: int, denominator: int) -> int:
    """``numerator / denominator``, which must be exact."""
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def get_attr_wrapped_model(model, attr: str, allow_none: bool = True, return_model_obj: bool = False):
    """``attr`` of the first module in ``model``'s ``.module`` chain that has it (not None unless ``allow_none``);
    that module itself with ``return_model_obj``."""
    if isinstance(model, list):
        raise RuntimeError("_get_attr_wrapped_model given a list of models")
    while (not hasattr(model, attr)) if allow_none else getattr(model, attr, None) is None:
        if not hasattr(model, "module"):
            raise RuntimeError(f"_get_attr_wrapped_model couldn't find attribute {attr}")
        model = model.module
    return model if return_model_obj else getattr(model, attr)


def get_model_config(model):
    return get_attr_wrapped_model(model, "config", allow_none=False)


def _release(version: str) -> tuple[int, int, int]:
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if m is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(x or 0) for x in m.groups())


def is_torch_min_version(version: str, check_equality: bool = True) -> bool:
    """Whether torch's release (``2.15.0`` of ``2.15.0+cpu``) is at least ``version`` (above it without
    ``check_equality``)."""
    have, want = _release(torch.__version__), _release(version)
    return have >= want if check_equality else have > want
