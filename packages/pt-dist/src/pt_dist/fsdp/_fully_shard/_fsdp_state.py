"""``FSDPState``: the module hooks that drive the parameter groups (torch's
torch/distributed/fsdp/_fully_shard/_fsdp_state.py).

One state per ``fully_shard`` call. Its forward pre-hook unshards (the first state to run forward becomes the
root and lazily initializes every state below it), its forward hook reshards and puts a gradient hook on the
outputs; that hook (``_pre_backward``) unshards again for backward and, once per backward, queues the root's
final callback on autograd's engine, which runs ``post_backward`` for groups autograd never reached and lands
the last reduce-scatter.
"""

from __future__ import annotations

import functools
import logging
import weakref

import torch
import torch.utils._pytree as pytree
from torch import nn

from pt_dist.fsdp._fully_shard._fsdp_api import MixedPrecisionPolicy
from pt_dist.fsdp._fully_shard._fsdp_common import TrainingState, _cast_fp_tensor
from pt_dist.fsdp._fully_shard._fsdp_param_group import FSDPCommContext, FSDPParamGroup

logger = logging.getLogger("pt_dist.fsdp.fully_shard")

__all__ = ["FSDPState", "FSDPStateContext"]

_module_state_mapping: weakref.WeakKeyDictionary[nn.Module, FSDPState] = weakref.WeakKeyDictionary()


def _insert_module_state(module: nn.Module, state: FSDPState) -> None:
    _module_state_mapping[module] = state


def _get_module_fsdp_state(module: nn.Module) -> FSDPState | None:
    return _module_state_mapping.get(module)


class FSDPStateContext:
    """What every state under one root shares."""

    def __init__(self) -> None:
        self.all_states: list[FSDPState] = []  # the root's tree, in named_modules() pre-order
        self.iter_forward_root: FSDPState | None = None  # runs the once-per-forward logic
        self.post_backward_final_callback_queued = False
        self.is_last_backward = True


class FSDPState:
    _state_name = "FSDP"

    def __init__(self) -> None:
        self._fsdp_param_groups: list[FSDPParamGroup] = []
        self._is_root: bool | None = None  # decided at lazy init
        self._state_ctx = FSDPStateContext()
        self._comm_ctx = FSDPCommContext()
        self._training_state = TrainingState.IDLE
        self._states_to_forward_prefetch: list[FSDPState] = []
        self._states_to_backward_prefetch: list[FSDPState] = []
        self._auto_reshard_after_forward: bool | None = True

    @property
    def _fsdp_param_group(self) -> FSDPParamGroup | None:
        return self._fsdp_param_groups[0] if self._fsdp_param_groups else None

    def init(self, modules: tuple[nn.Module, ...], device: torch.device, mp_policy: MixedPrecisionPolicy,
             auto_reshard_after_forward: bool) -> None:
        for module in modules:
            _insert_module_state(module, self)
        self._modules = modules
        self._device = device
        self._mp_policy = mp_policy
        self._auto_reshard_after_forward = auto_reshard_after_forward
        self._pre_forward_hook_handle = modules[0].register_forward_pre_hook(self._pre_forward, prepend=True,
                                                                             with_kwargs=True)
        self._post_forward_hook_handle = modules[0].register_forward_hook(self._post_forward, prepend=False)

    # -- lazy init (the root) ------------------------------------------------------------------------------------

    def _lazy_init(self) -> None:
        """The first state to run forward is the root: all ``fully_shard`` calls are done by then."""
        if self._is_root is not None:
            return
        root_module = self._modules[0]
        self._is_root = True
        for module_name, module in root_module.named_modules():
            if (state := _get_module_fsdp_state(module)) is None:
                continue
            if module is not root_module:
                if state not in self._state_ctx.all_states and state._is_root is not None:
                    raise RuntimeError(f"FSDP state has already been lazily initialized for {module_name}\nFSDP "
                                       "requires running forward through the root module first")
                state._is_root = False
            if state not in self._state_ctx.all_states:
                self._state_ctx.all_states.append(state)
        if self._auto_reshard_after_forward:  # the root's parameters are needed again at once by backward
            for group in self._fsdp_param_groups:
                group.post_forward_mesh_info = None
        self._init_fqns()
        for state in self._state_ctx.all_states:
            state._state_ctx, state._comm_ctx = self._state_ctx, self._comm_ctx
            for group in state._fsdp_param_groups:
                group.comm_ctx = self._comm_ctx
                group.lazy_init()

    def _init_fqns(self) -> None:
        root_module = self._modules[0]
        param_to_fsdp_param, module_to_group = {}, {}
        for state in self._state_ctx.all_states:
            for group in state._fsdp_param_groups:
                for fsdp_param in group.fsdp_params:
                    param_to_fsdp_param[fsdp_param.sharded_param] = fsdp_param
                for module in group.modules:
                    module_to_group[module] = group
        for name, param in root_module.named_parameters():
            if param in param_to_fsdp_param:
                param_to_fsdp_param[param]._param_fqn = name
        for name, module in root_module.named_modules():
            if module in module_to_group:
                module_to_group[module]._module_fqn = name

    # -- forward -------------------------------------------------------------------------------------------------

    def _root_pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        self._lazy_init()
        if self._state_ctx.iter_forward_root is not None:
            return args, kwargs
        logger.debug("FSDP::root_pre_forward")
        self._state_ctx.iter_forward_root = self
        if self._device.type != "cpu":  # inputs to the mesh's device, as DDP does
            move = functools.partial(_to_device, self._device)
            args, kwargs = pytree.tree_map(move, args), pytree.tree_map(move, kwargs)
        return args, kwargs

    def _pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self._training_state == TrainingState.PRE_BACKWARD:  # activation checkpointing re-runs forward
            for group in self._fsdp_param_groups:
                if not group.is_unsharded:
                    group.unshard()
                    group.wait_for_unshard()
            return self._cast_forward_inputs(args, kwargs)
        first_in_pass = self._training_state != TrainingState.FORWARD
        self._training_state = TrainingState.FORWARD
        if first_in_pass:
            args, kwargs = self._root_pre_forward(module, args, kwargs)
        args, kwargs = self._cast_forward_inputs(args, kwargs)
        for group in self._fsdp_param_groups:
            args, kwargs = group.pre_forward(module, args, kwargs)
        if first_in_pass:
            for state in self._states_to_forward_prefetch:
                for target in state._fsdp_param_groups:
                    FSDPParamGroup._prefetch_unshard(target, "forward")
        return args, kwargs

    def _post_forward(self, module: nn.Module, input, output):
        if self._training_state == TrainingState.PRE_BACKWARD:  # the checkpointed re-run: backward reshards
            return self._cast_output_dtype(output)
        for group in self._fsdp_param_groups:
            output = group.post_forward(module, input, output)
        output = self._register_pre_backward_hook(output)
        self._training_state = TrainingState.IDLE
        if self._state_ctx.iter_forward_root is self:
            self._state_ctx.iter_forward_root = None
        return self._cast_output_dtype(output)

    def _cast_forward_inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not (self._mp_policy.cast_forward_inputs and self._mp_policy.param_dtype):
            return args, kwargs
        cast = functools.partial(_cast_fp_tensor, self._mp_policy.param_dtype)
        return pytree.tree_map(cast, args), pytree.tree_map(cast, kwargs)

    def _cast_output_dtype(self, output):
        if self._mp_policy.output_dtype is None:
            return output
        return pytree.tree_map(functools.partial(_cast_fp_tensor, self._mp_policy.output_dtype), output)

    # -- backward ------------------------------------------------------------------------------------------------

    def _register_pre_backward_hook(self, output):
        if not torch.is_grad_enabled():
            return output
        for t in pytree.tree_leaves(output):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._pre_backward)
        return output

    def _pre_backward(self, grad: torch.Tensor) -> torch.Tensor:
        self._training_state = TrainingState.PRE_BACKWARD
        self._register_root_post_backward_final_callback()
        default_prefetch = len(self._states_to_backward_prefetch) == 0
        for group in self._fsdp_param_groups:
            group.pre_backward(default_prefetch)
        for state in self._states_to_backward_prefetch:
            for target in reversed(state._fsdp_param_groups):
                FSDPParamGroup._prefetch_unshard(target, "backward")
        return grad

    def _register_root_post_backward_final_callback(self) -> None:
        if self._state_ctx.post_backward_final_callback_queued:
            return
        self._state_ctx.post_backward_final_callback_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self._root_post_backward_final_callback)

    def _root_post_backward_final_callback(self) -> None:
        logger.debug("FSDP::root_post_backward")
        self._state_ctx.iter_forward_root = None
        for state in self._state_ctx.all_states:
            for group in reversed(state._fsdp_param_groups):
                if group._training_state != TrainingState.POST_BACKWARD:
                    group.post_backward()  # e.g. the first module: its inputs needed no gradient
                group._training_state = TrainingState.IDLE
            state._training_state = TrainingState.IDLE
        if self._state_ctx.is_last_backward:
            self.wait_for_gradient_reduction()
        self._state_ctx.post_backward_final_callback_queued = False

    def wait_for_gradient_reduction(self) -> None:
        self._comm_ctx.land_pending_reduces()
        for state in self._state_ctx.all_states:
            for group in state._fsdp_param_groups:
                group.finalize_backward()
        self._comm_ctx.post_forward_order.clear()


def _to_device(device: torch.device, x):
    return x.to(device) if isinstance(x, torch.Tensor) else x
