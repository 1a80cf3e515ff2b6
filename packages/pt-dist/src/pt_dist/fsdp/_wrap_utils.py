"""Auto-wrapping: which submodules become FSDP units of their own (torch/distributed/fsdp/wrap.py and
``_wrap_utils.py``'s ``_auto_wrap``).

A policy is called as ``policy(module=, recurse=, nonwrapped_numel=)``: with ``recurse=True`` it says whether to
look inside ``module``, with ``recurse=False`` whether to wrap it, given the parameters of it not yet wrapped
below. ``_recursive_wrap`` applies it bottom-up (children first), so a transformer's blocks become units and
the root keeps what is left (embeddings, final norm, head). ``ModuleWrapPolicy`` is the policy of the reading
guide; torch's other policies and the manual ``enable_wrap`` / ``wrap`` are in pt_dist/_compat/fsdp/wrap.py.
"""

from __future__ import annotations

__all__ = ["ModuleWrapPolicy", "always_wrap_policy"]


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
