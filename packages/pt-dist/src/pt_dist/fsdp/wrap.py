"""Auto-wrapping: which submodules become FSDP units of their own (torch/distributed/fsdp/wrap.py).

A policy is called as ``policy(module=, recurse=, nonwrapped_numel=)``: with ``recurse=True`` it says whether to
look inside ``module``, with ``recurse=False`` whether to wrap it, given the parameters of it not yet wrapped
below. ``_recursive_wrap`` applies it bottom-up (children first), so a transformer's blocks become units and
the root keeps what is left (embeddings, final norm, head).
"""

from __future__ import annotations

import contextlib

from torch import nn

__all__ = [
    "ModuleWrapPolicy",
    "always_wrap_policy",
    "enable_wrap",
    "wrap",
    "lambda_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]


def always_wrap_policy(*args, **kwargs) -> bool:
    return True


def _module_wrap_policy(module, recurse, nonwrapped_numel, module_classes) -> bool:
    return True if recurse else isinstance(module, tuple(module_classes))


class ModuleWrapPolicy:
    """Wrap every module that is an instance of one of ``module_classes`` (a transformer's block class)."""

    def __init__(self, module_classes):
        self._module_classes = tuple(set(module_classes))

    def __call__(self, module, recurse, *args, **kwargs) -> bool:
        return _module_wrap_policy(module, recurse, -1, self._module_classes)

    def __repr__(self) -> str:
        return f"ModuleWrapPolicy({[c.__name__ for c in self._module_classes]})"


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


def _recursive_wrap(
    module, auto_wrap_policy, wrapper_cls, ignored, ignored_params, /, only_wrap_children: bool = False, **kwargs
):
    """``(module or its wrapper, parameters wrapped)``: children wrapped first, then ``module`` if the policy asks,
    for what its children left unwrapped."""
    if module in ignored or isinstance(module, wrapper_cls):
        return module, 0
    nonwrapped = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not auto_wrap_policy(module=module, recurse=True, nonwrapped_numel=nonwrapped):
        return module, 0
    wrapped = 0
    for name, child in module.named_children():
        if child in ignored:
            continue
        child, n = _recursive_wrap(child, auto_wrap_policy, wrapper_cls, ignored, ignored_params, **kwargs)
        setattr(module, name, child)
        wrapped += n
    left = nonwrapped - wrapped
    if not only_wrap_children and auto_wrap_policy(module=module, recurse=False, nonwrapped_numel=left):
        return wrapper_cls(module, **kwargs), nonwrapped
    return module, wrapped


def _as_policy(auto_wrap_policy):
    """A policy given as a set of module classes means ModuleWrapPolicy of them (torch accepts that too)."""
    if isinstance(auto_wrap_policy, (set, frozenset, list, tuple)):
        return ModuleWrapPolicy(auto_wrap_policy)
    if not callable(auto_wrap_policy):
        raise TypeError(
            f"FullyShardedDataParallel: auto_wrap_policy must be callable or a set of module classes, "
            f"got {auto_wrap_policy!r}"
        )
    return auto_wrap_policy


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
