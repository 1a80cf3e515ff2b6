"""torch's other auto-wrap policies and its manual wrapping (torch/distributed/fsdp/wrap.py): the older
function forms (``transformer_auto_wrap_policy``, ``lambda_auto_wrap_policy``, ``size_based_auto_wrap_policy``),
``CustomPolicy`` (a function of the module: wrap or not, or the unit's own constructor arguments), and
``enable_wrap`` / ``wrap``; over the core's ``_recursive_wrap`` (pt_dist/fsdp/_wrap_utils.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from torch import nn

from pt_dist.fsdp._wrap_utils import _module_wrap_policy

__all__ = ["CustomPolicy", "enable_wrap", "lambda_auto_wrap_policy", "size_based_auto_wrap_policy",
           "transformer_auto_wrap_policy", "wrap"]

_POLICY_KWARGS = "_fsdp_custom_policy_kwargs"  # a module's own unit arguments, set by CustomPolicy for the wrapper


def transformer_auto_wrap_policy(module, recurse, nonwrapped_numel, transformer_layer_cls) -> bool:
    """``functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})``, torch's older form."""
    return _module_wrap_policy(module, recurse, nonwrapped_numel, transformer_layer_cls)


def lambda_auto_wrap_policy(module, recurse, nonwrapped_numel, lambda_fn) -> bool:
    return True if recurse else bool(lambda_fn(module))


def size_based_auto_wrap_policy(
    module,
    recurse,
    nonwrapped_numel,
    min_num_params: int = int(1e8),
    force_leaf_modules=None,
    exclude_wrap_modules=None,
) -> bool:
    """Wrap a module once it holds ``min_num_params`` parameters not already wrapped below it; never look inside
    ``force_leaf_modules``, never wrap ``exclude_wrap_modules`` (containers) themselves."""
    force_leaf = tuple(force_leaf_modules or size_based_auto_wrap_policy.FORCE_LEAF_MODULES)
    exclude = tuple(exclude_wrap_modules or size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES)
    large = nonwrapped_numel >= min_num_params
    return (large and not isinstance(module, force_leaf)) if recurse else (large and not isinstance(module, exclude))


size_based_auto_wrap_policy.FORCE_LEAF_MODULES = {nn.MultiheadAttention}  # torch's defaults, as attributes
size_based_auto_wrap_policy.EXCLUDE_WRAP_MODULES = {nn.ModuleList, nn.ModuleDict}


class CustomPolicy:
    """Wrap each module for which ``lambda_fn(module)`` is True, or a dict: then with those constructor arguments
    over the root's (torch's ``CustomPolicy``; the root itself is never re-wrapped)."""

    def __init__(self, lambda_fn: Callable[[nn.Module], bool | dict[str, Any]]):
        self._lambda_fn = lambda_fn

    def __call__(self, module, recurse, *args, **kwargs) -> bool:
        if recurse:
            return True
        res = self._lambda_fn(module)
        if not isinstance(res, (dict, bool)):
            raise ValueError(f"The lambda_fn passed to CustomPolicy should return False/True or a kwarg dict, but "
                             f"it returned {res}")
        if isinstance(res, dict) and res:
            module.__dict__[_POLICY_KWARGS] = dict(res)
        return bool(res)


class _WrapContext:
    """What ``enable_wrap`` set: the wrapper class and its arguments, for ``wrap`` calls inside (torch's
    ``_ConfigAutoWrap``)."""

    active = False
    wrapper_cls = None
    kwargs: dict = {}


@contextlib.contextmanager
def enable_wrap(*, wrapper_cls, **wrapper_kwargs):
    """Inside, ``wrap(module)`` returns ``wrapper_cls(module, **wrapper_kwargs)``; outside it returns the module."""
    if _WrapContext.active:
        raise NotImplementedError(
            "You are already within an autowrap context and we currently do not supported nested autowrap."
        )
    _WrapContext.active, _WrapContext.wrapper_cls, _WrapContext.kwargs = True, wrapper_cls, dict(wrapper_kwargs)
    try:
        yield
    finally:
        _WrapContext.active, _WrapContext.wrapper_cls, _WrapContext.kwargs = False, None, {}


def wrap(module: nn.Module, **wrap_overrides) -> nn.Module:
    """Wrap ``module`` as ``enable_wrap`` says, ``wrap_overrides`` over its arguments (and over both, a module's
    own ``_wrap_overrides``, as torch's); a no-op outside ``enable_wrap``."""
    if not _WrapContext.active:
        return module
    kwargs = {**_WrapContext.kwargs, **wrap_overrides, **getattr(module, "_wrap_overrides", {})}
    return _WrapContext.wrapper_cls(module, **kwargs)
