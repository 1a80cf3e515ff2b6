"""``fully_shard`` and ``FSDPModule`` (torch's torch/distributed/fsdp/_fully_shard/_fully_shard.py).

``fully_shard(module)`` puts the parameters of ``module``'s tree (less those of nested ``fully_shard`` modules) in
one ``FSDPParamGroup``, sharded on dim 0 over ``mesh`` as ``DTensor`` parameters, registers the forward hooks of
an ``FSDPState``, and changes ``module``'s class to ``FSDP<Class>`` (``FSDPModule`` first in the MRO). Call it
bottom-up: per block, then on the root.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

from torch import nn

from pt_dist.fsdp._fully_shard._fsdp_api import MixedPrecisionPolicy, OffloadPolicy, _validate_policies
from pt_dist.fsdp._fully_shard._fsdp_init import (
    _apply_to_module,
    _get_device_from_mesh,
    _get_managed_modules,
    _get_managed_states,
    _get_mesh_info,
    _get_post_forward_mesh_info,
    _init_default_mesh,
    _move_states_to_device,
    _validate_mesh,
    _validate_module,
)
from pt_dist.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
from pt_dist.fsdp._fully_shard._fsdp_state import FSDPState, _get_module_fsdp_state

__all__ = ["FSDPModule", "UnshardHandle", "disable_fsdp_module_new_init", "fully_shard", "get_cls_to_fsdp_cls"]

cls_to_fsdp_cls: dict[type, type] = {}


def get_cls_to_fsdp_cls() -> dict[type, type]:
    return cls_to_fsdp_cls


def fully_shard(module, *, mesh=None, reshard_after_forward: bool | int | None = None, shard_placement_fn=None,
                mp_policy: MixedPrecisionPolicy = MixedPrecisionPolicy(),  # noqa: B008 - torch's default
                offload_policy: OffloadPolicy = OffloadPolicy(),  # noqa: B008
                ignored_params: set[nn.Parameter] | None = None, dp_mesh_dims=None):
    """Shard ``module``'s parameters over ``mesh`` (1-D: FSDP; 2-D: HSDP, replicate dim 0 / shard dim 1).

    ``reshard_after_forward``: ``True`` frees the unsharded parameters after forward and all-gathers again in
    backward; ``False`` keeps them; ``None`` is ``True`` except for the root. Returns ``module`` (now an
    ``FSDPModule``)."""
    if isinstance(module, (list, tuple)):
        raise NotImplementedError("fully_shard: a list of modules sharing one group is not supported here, got "
                                  f"{[type(m).__name__ for m in module]}")
    _validate_module(module, "fully_shard")
    if shard_placement_fn is not None:
        raise NotImplementedError(f"fully_shard: shard_placement_fn is not supported here (dim 0 only), got "
                                  f"{shard_placement_fn!r}")
    if dp_mesh_dims is not None:
        raise NotImplementedError(f"fully_shard: dp_mesh_dims is not supported here, got {dp_mesh_dims!r}")
    _validate_policies(mp_policy, offload_policy)
    if ignored_params is not None and not isinstance(ignored_params, (set, frozenset)):
        raise TypeError(f"fully_shard: ignored_params must be a set of parameters, got {ignored_params!r}")
    if _get_module_fsdp_state(module) is not None:  # torch's @contract check, its words
        raise AssertionError("Each distinct composable distributed API can only be applied to a module once. "
                             f"fully_shard has already been applied to the following module:\n{module}")
    mesh = mesh or _init_default_mesh()
    _validate_mesh(mesh)
    mesh_info = _get_mesh_info(mesh)
    device = _get_device_from_mesh(mesh)
    auto_reshard_after_forward = reshard_after_forward is None
    post_forward_mesh_info = _get_post_forward_mesh_info(
        True if auto_reshard_after_forward else reshard_after_forward, mesh_info)
    modules = (module,)
    managed_modules = _get_managed_modules(modules)
    params, buffers = _get_managed_states(managed_modules, ignored_params)
    _move_states_to_device(params, buffers, device)

    state = FSDPState()
    state.init(modules, device, mp_policy, auto_reshard_after_forward)
    if params:
        state._fsdp_param_groups.append(FSDPParamGroup(params, modules, mesh_info, post_forward_mesh_info, device,
                                                       mp_policy, offload_policy))
    for managed_module in managed_modules:
        managed_module._is_fsdp_managed_module = True
        managed_module._fsdp_use_orig_params = True
    _apply_to_module(modules, cls_to_fsdp_cls, FSDPModule, "FSDP", _unimplemented_deepcopy)
    return module


def _unimplemented_deepcopy(*args, **kwargs):
    raise AssertionError("FSDP does not support deepcopy. Please use state dict for serialization.")


_enable_fsdp_module_new_init = True


@contextmanager
def disable_fsdp_module_new_init():
    global _enable_fsdp_module_new_init
    prev, _enable_fsdp_module_new_init = _enable_fsdp_module_new_init, False
    try:
        yield
    finally:
        _enable_fsdp_module_new_init = prev


def _fsdp_modules(module: nn.Module, recurse: bool) -> list[FSDPModule]:
    return [m for m in (module.modules() if recurse else [module]) if isinstance(m, FSDPModule)]


class FSDPModule:
    _orig_cls_mro_index = 2  # [FSDP<Orig>, FSDPModule, Orig, ...]

    def __new__(cls, *args, **kwargs):
        """Construct the original class (e.g. ``nn.Sequential[1:]`` building a new container), not FSDP's."""
        orig_cls = cls.__mro__[cls._orig_cls_mro_index]
        self = orig_cls.__new__(orig_cls, *args, **kwargs)
        if _enable_fsdp_module_new_init:
            self.__init__(*args, **kwargs)
        return self

    def reshard(self) -> None:
        """Register the sharded parameters and free the unsharded ones (not recursive)."""
        for group in self._get_fsdp_state()._fsdp_param_groups:
            group.reshard()

    def unshard(self, async_op: bool = False) -> UnshardHandle | None:
        """All-gather the parameters (in ``param_dtype``), not recursive; ``async_op`` returns a handle to wait on
        (the module's pre-forward waits for it otherwise)."""
        state = self._get_fsdp_state()
        for group in state._fsdp_param_groups:
            group.lazy_init()
            group.unshard(async_op=async_op)
        handle = _UnshardHandleImpl(list(state._fsdp_param_groups) or None)
        if async_op:
            return handle
        handle.wait()
        return None

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        self._get_fsdp_state()._state_ctx.is_last_backward = is_last_backward

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """``False``: accumulate gradients on the unsharded parameters without communication (FSDP1's ``no_sync``);
        for HSDP both the reduce-scatter and the all-reduce."""
        for module in _fsdp_modules(self, recurse):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                group.reduce_grads = requires_gradient_sync
                group.all_reduce_grads = requires_gradient_sync

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """HSDP: reduce-scatter but do not all-reduce (the partial sums wait for the next synced backward)."""
        for module in _fsdp_modules(self, recurse):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                group.all_reduce_grads = requires_all_reduce

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward should be a bool, got {type(reshard_after_forward)}")
        for module in _fsdp_modules(self, recurse):
            state = module._get_fsdp_state()
            state._auto_reshard_after_forward = False
            for group in state._fsdp_param_groups:
                group.post_forward_mesh_info = _get_post_forward_mesh_info(reshard_after_forward, group.mesh_info)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """``False`` keeps the unsharded parameters after backward (gradient accumulation: no all-gather before the
        next forward). Call ``reshard`` before stepping the optimizer."""
        for module in _fsdp_modules(self, recurse):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                group.reshard_after_backward = reshard_after_backward

    def set_modules_to_forward_prefetch(self, modules: list[FSDPModule]) -> None:
        """Start these modules' all-gathers right after this module's own, in forward."""
        _assert_all_fsdp_modules(modules)
        self._get_fsdp_state()._states_to_forward_prefetch = [m._get_fsdp_state() for m in modules]

    def set_modules_to_backward_prefetch(self, modules: list[FSDPModule]) -> None:
        """Prefetch these modules' all-gathers in backward, replacing the default (the previous module in forward)."""
        _assert_all_fsdp_modules(modules)
        self._get_fsdp_state()._states_to_backward_prefetch = [m._get_fsdp_state() for m in modules]

    def set_gradient_divide_factor(self, factor: float) -> None:
        for group in self._get_fsdp_state()._fsdp_param_groups:
            group.gradient_divide_factor = factor

    def set_all_reduce_hook(self, hook, *, stream=None) -> None:
        """``hook(reduce_output)`` on each reduced flat gradient: after the reduce-scatter, or HSDP's all-reduce."""
        if stream is not None:
            raise ValueError("set_all_reduce_hook: stream is a CUDA stream; pt_dist reduces on the group's thread")
        for group in self._get_fsdp_state()._fsdp_param_groups:
            group._all_reduce_hook = hook

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        warnings.warn("Use `set_gradient_divide_factor` instead", DeprecationWarning, stacklevel=2)
        self.set_gradient_divide_factor(factor)

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        for group in self._get_fsdp_state()._fsdp_param_groups:
            group.force_sum_reduction_for_comms = enable

    def set_unshard_in_backward(self, unshard_in_backward: bool) -> None:
        for group in self._get_fsdp_state()._fsdp_param_groups:
            group.unshard_in_backward = unshard_in_backward

    def _set_unshard_async_op(self, async_op: bool) -> None:
        for module in _fsdp_modules(self, True):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                group.unshard_async_op = async_op

    def _get_fsdp_state(self) -> FSDPState:
        if (state := _get_module_fsdp_state(self)) is None:
            raise AssertionError(f"No FSDP state found on {self}")
        return state

    def _apply(self, fn, recurse: bool = True):
        """``module.to(...)``: reshard first so the sharded parameters are the ones converted, then re-point."""
        self.reshard()
        ret = super()._apply(fn, recurse=recurse)
        for group in self._get_fsdp_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                fsdp_param.reset_sharded_param()
        return ret


class UnshardHandle:
    """A handle to wait on a :meth:`FSDPModule.unshard` op."""

    def wait(self) -> None:
        return


class _UnshardHandleImpl(UnshardHandle):
    def __init__(self, fsdp_param_groups: list[FSDPParamGroup] | None):
        self._fsdp_param_groups = fsdp_param_groups

    def wait(self) -> None:
        if self._fsdp_param_groups is not None:
            for group in self._fsdp_param_groups:
                group.wait_for_unshard()
            self._fsdp_param_groups = None


def _assert_all_fsdp_modules(modules) -> None:
    for module in modules:
        if not isinstance(module, FSDPModule):
            raise ValueError(f"Expects FSDPModule but got {type(module)}: {module}")
