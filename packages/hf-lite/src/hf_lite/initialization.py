"""Building a model without initialising it, in a chosen dtype (transformers' ``initialization.no_init_weights`` and
``PreTrainedModel._set_default_dtype``): ``from_pretrained`` overwrites every weight, so random init is wasted time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_INIT_FUNCTIONS = ["uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_"]
_state = {"init_weights": True}


def init_weights_enabled() -> bool:
    """False inside ``no_init_weights``: ``post_init`` then skips ``_init_weights``."""
    return _state["init_weights"]


def _skip(tensor, *args, **kwargs):
    return tensor


@contextlib.contextmanager
def no_init_weights() -> Iterator[None]:
    """Leave new parameters uninitialised: ``torch.nn.init`` functions (what ``nn.Linear`` & co. call) and the
    models' ``_init_weights`` do nothing. Process-wide while active, as in transformers."""
    if not _state["init_weights"]:  # nested: the outer context restores
        yield
        return
    saved = {name: getattr(torch.nn.init, name) for name in _INIT_FUNCTIONS}
    _state["init_weights"] = False
    for name in _INIT_FUNCTIONS:
        setattr(torch.nn.init, name, _skip)
    try:
        yield
    finally:
        _state["init_weights"] = True
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Create floating tensors in ``dtype``. Buffers computed in an explicit dtype (RoPE's fp32 ``inv_freq``) keep it,
    which a ``model.to(dtype)`` afterwards would not."""
    if dtype is None:
        yield
        return
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)
