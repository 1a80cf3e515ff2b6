"""``deepspeed.utils.instrument_w_nvtx`` (``deepspeed/utils/nvtx.py``): a function's calls as named ranges in the
accelerator's profiler (NVTX on CUDA, in DeepSpeed's domain where the accelerator has domains; nothing on cpu),
skipped while ``torch.compile`` traces, as DeepSpeed's."""

from __future__ import annotations

import functools

import torch

from ds_zero._compat.accelerator import get_accelerator

enable_nvtx = True
DEEPSPEED_NVTX_DOMAIN = "DeepSpeed"


def _range(push: bool, msg: str | None = None) -> None:
    accel = get_accelerator()
    domain = {"domain": DEEPSPEED_NVTX_DOMAIN} if getattr(accel, "supports_nvtx_domain", False) else {}
    if push:
        accel.range_push(msg, **domain)
    else:
        accel.range_pop(**domain)


def instrument_w_nvtx(func):
    @functools.wraps(func)
    def wrapped_fn(*args, **kwargs):
        record = enable_nvtx and not torch.compiler.is_compiling()
        if record:
            _range(True, func.__qualname__)
        ret_val = func(*args, **kwargs)
        if record:
            _range(False)
        return ret_val

    return wrapped_fn
