"""``register_fsdp_forward_method`` (torch's, in ``fsdp/_fully_shard/_fully_shard.py``): FSDP2's pre/post-forward
(unshard, reshard) around a method other than ``forward`` that runs the module's parameters, such as
``generate``."""

from __future__ import annotations

import functools

from torch import nn

from pt_dist.fsdp._fully_shard._fully_shard import FSDPModule

__all__ = ["register_fsdp_forward_method"]


def register_fsdp_forward_method(module: nn.Module, method_name: str) -> None:
    """Run FSDP's pre/post-forward around ``module.<method_name>`` too (e.g. ``generate``); no-op if not FSDP."""
    if not isinstance(module, FSDPModule):
        return
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module)} does not have a method {method_name}")
    orig_method = getattr(module, method_name)

    @functools.wraps(orig_method)
    def wrapped_method(self, *args, **kwargs):
        fsdp_state = self._get_fsdp_state()
        args, kwargs = fsdp_state._pre_forward(self, args, kwargs)
        out = orig_method(*args, **kwargs)
        return fsdp_state._post_forward(self, args, out)

    setattr(module, method_name, wrapped_method.__get__(module, type(module)))
