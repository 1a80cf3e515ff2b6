"""``FSDPParamGroup``: the parameters one ``fully_shard`` call manages, communicated together (torch's
torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py).

A group's life in one iteration:

1. ``pre_forward``: ``unshard`` (one all-gather of every parameter's shard; skipped if prefetched) ->
   ``wait_for_unshard`` (copy out into each parameter's unsharded tensor, register the unsharded parameters) ->
   wrap the module's inputs in ``RegisterPostBackwardFunction`` so autograd calls ``post_backward`` once the
   gradients of the inputs (hence of the module's parameters) are computed;
2. ``post_forward``: ``reshard`` (register the sharded ``DTensor`` parameters again, free the unsharded storage)
   when ``reshard_after_forward``; record the group in the forward order backward prefetches by;
3. ``pre_backward`` (a hook on the module's outputs' gradients): unshard again, prefetch the group that ran
   before it in forward;
4. ``post_backward``: take the unsharded gradients, reshard, land the previous group's reduce-scatter, and start
   this group's (one reduce-scatter, HSDP then one all-reduce); the root's final callback lands the last.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import torch
import torch.utils._pytree as pytree
from torch import nn

from pt_dist.fsdp._fully_shard._fsdp_api import MixedPrecisionPolicy, OffloadPolicy
from pt_dist.fsdp._fully_shard._fsdp_collectives import (
    AllGatherResult,
    PendingReduce,
    foreach_all_gather,
    foreach_all_gather_copy_out,
    foreach_reduce,
    foreach_reduce_finish,
)
from pt_dist.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo, TrainingState, is_bw
from pt_dist.fsdp._fully_shard._fsdp_param import FSDPParam, ParamModuleInfo, ShardedState, alloc_storage

logger = logging.getLogger("pt_dist.fsdp.fully_shard")

__all__ = ["FSDPCommContext", "FSDPParamGroup", "RegisterPostBackwardFunction"]


class FSDPCommContext:
    """What the groups under one root share: the forward order (for backward prefetch) and the reduce-scatter in
    flight (at most one, as torch's default ``max_input_buffers=1``: the next group's post-backward lands it)."""

    def __init__(self) -> None:
        self.post_forward_order: list[FSDPParamGroup] = []
        self.pending_reduce_groups: list[FSDPParamGroup] = []

    def land_pending_reduces(self) -> None:
        while self.pending_reduce_groups:
            self.pending_reduce_groups.pop(0)._finish_reduce()


class FSDPParamGroup:
    def __init__(self, params: list[nn.Parameter], modules: tuple[nn.Module, ...], mesh_info: FSDPMeshInfo,
                 post_forward_mesh_info: FSDPMeshInfo | None, device: torch.device,
                 mp_policy: MixedPrecisionPolicy, offload_policy: OffloadPolicy):
        self.modules = modules
        self.fsdp_params = [FSDPParam(param, info, mesh_info, post_forward_mesh_info, device, mp_policy,
                                      offload_policy)
                            for param, info in zip(params, _get_param_module_infos(params, modules))]
        self.mesh_info = mesh_info
        self.post_forward_mesh_info = post_forward_mesh_info
        self.device = device
        self.mp_policy = mp_policy
        self.offload_policy = offload_policy
        self._training_state = TrainingState.IDLE
        self._sharded_state = ShardedState.SHARDED
        self._module_fqn: str | None = None
        self._reset_sharded_params = False
        self._state_dict_hook_handles: list = []
        self.comm_ctx = FSDPCommContext()
        self._post_forward_indices: list[int] = []
        self.reduce_grads = True  # set_requires_gradient_sync
        self.all_reduce_grads = True  # set_requires_all_reduce (HSDP)
        self.reshard_after_backward = True
        self.gradient_divide_factor: float | None = None
        self._all_reduce_hook = None  # set_all_reduce_hook
        self.force_sum_reduction_for_comms = False
        self.unshard_async_op = False
        self.unshard_in_backward = True
        self._all_gather_result: AllGatherResult | None = None
        self._pending_reduce: PendingReduce | None = None
        self._partial_reduce_output: torch.Tensor | None = None  # HSDP gradients awaiting the all-reduce
        self._partial_reduce_params: list[FSDPParam] = []

    # -- initialization ------------------------------------------------------------------------------------------

    def lazy_init(self) -> None:
        if self.is_sharded and not self._reset_sharded_params:
            for fsdp_param in self.fsdp_params:
                fsdp_param.reset_sharded_param()
            self._reset_sharded_params = True
        meta = [p._param_fqn for p in self.fsdp_params if p.sharded_param.device.type == "meta"]
        if meta:
            raise RuntimeError(f"FSDP parameters should be materialized from meta device before training, but the "
                               f"following were still on meta device: {meta}")
        self._init_mp_dtypes()
        self._register_state_dict_hooks()

    def _init_mp_dtypes(self) -> None:
        for fsdp_param in self.fsdp_params:
            fsdp_param.init_dtype_attrs(self.mp_policy)
        trainable = [p for p in self.fsdp_params if p.sharded_param.requires_grad]
        orig_dtypes = {p.orig_dtype for p in trainable}
        if len(orig_dtypes) > 1:
            raise AssertionError(f"FSDP expects uniform original parameter dtype but got {orig_dtypes}")
        reduce_dtypes = {p.unsharded_grad_dtype for p in trainable}
        self._reduce_dtype = next(iter(reduce_dtypes)) if len(reduce_dtypes) == 1 else None
        # gradients autograd produces in param_dtype but that accumulate / reduce in a wider dtype (bf16 -> fp32)
        self._fsdp_params_with_wider_grad_dtype = [
            p for p in self.fsdp_params
            if p.unsharded_grad_dtype.itemsize > (p.param_dtype or p.orig_dtype).itemsize]

    def _register_state_dict_hooks(self) -> None:
        if self._state_dict_hook_handles:
            return
        for module in {p._module_info.module for p in self.fsdp_params}:
            self._state_dict_hook_handles += [module.register_state_dict_pre_hook(lambda *a, **k: self._to_sharded()),
                                              module._register_load_state_dict_pre_hook(
                                                  lambda *a, **k: self._to_sharded())]

    # -- runtime -------------------------------------------------------------------------------------------------

    def unshard(self, async_op: bool = False) -> None:
        if self._all_gather_result is not None or self.is_unsharded:
            return  # in flight, or already done
        if not self.unshard_in_backward and self._training_state == TrainingState.PRE_BACKWARD:
            return
        group = self._all_gather_process_group
        if group.size() == 1:
            self._all_gather_result = AllGatherResult(torch.empty(0), None, [], [], [])
            return
        self._all_gather_result = foreach_all_gather(self.fsdp_params, group, async_op, self.device)

    def wait_for_unshard(self) -> None:
        if self._all_gather_result is None:
            return
        group = self._all_gather_process_group
        if group.size() == 1:  # no communication: copy the (cast) shard
            for fsdp_param in self.fsdp_params:
                (inp,) = fsdp_param.all_gather_inputs
                fsdp_param.init_all_gather_outputs([inp.numel()], [inp.dtype], 1, self.device)
                out = fsdp_param.all_gather_outputs[0]
                alloc_storage(out)
                with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(out):
                    out.copy_(inp)
        else:
            foreach_all_gather_copy_out(self._all_gather_result, self.fsdp_params, group)
        for fsdp_param in self.fsdp_params:
            fsdp_param.init_unsharded_param()
        self._to_unsharded()
        self._all_gather_result = None  # frees the flat all-gather buffer

    def reshard(self) -> None:
        if self._training_state == TrainingState.FORWARD and not self._reshard_after_forward:
            return
        self._to_sharded()

    def pre_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        logger.debug("%s", self._with_fqn("FSDP::pre_forward"))
        entering = self._training_state != TrainingState.FORWARD
        self._training_state = TrainingState.FORWARD
        self.unshard(self.unshard_async_op)
        self.wait_for_unshard()
        if entering:
            args, kwargs = self._register_post_backward_hook(args, kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module | None, input, output):
        logger.debug("%s", self._with_fqn("FSDP::post_forward"))
        if not is_bw():  # a checkpointed forward re-run in backward does not reshard or reorder
            self.reshard()
            if torch.is_grad_enabled():  # the order backward prefetches by (no backward follows a no_grad forward)
                self._post_forward_indices.append(len(self.comm_ctx.post_forward_order))
                self.comm_ctx.post_forward_order.append(self)
        self._training_state = TrainingState.IDLE
        return output

    def pre_backward(self, default_prefetch: bool, *unused) -> None:
        if self._training_state == TrainingState.PRE_BACKWARD:
            return
        logger.debug("%s", self._with_fqn("FSDP::pre_backward"))
        self._training_state = TrainingState.PRE_BACKWARD
        self.unshard(self.unshard_async_op)  # no-op if prefetched
        self.wait_for_unshard()
        self._set_unsharded_grad_dtypes(defer_upcast=True)
        if default_prefetch:
            self._backward_prefetch()

    def post_backward(self, *unused) -> None:
        """Idempotent: also run from the root's final callback for groups autograd never reached."""
        logger.debug("%s", self._with_fqn("FSDP::post_backward"))
        self._training_state = TrainingState.POST_BACKWARD
        if not self.reduce_grads:  # accumulate on the unsharded parameters, communicate nothing
            self._set_unsharded_grad_dtypes(defer_upcast=False)
            if self.reshard_after_backward:
                self.reshard()
            return
        fsdp_params_with_grad, unsharded_grads = self._take_unsharded_grads_to_reduce()
        self._set_unsharded_grad_dtypes(defer_upcast=False)
        if self.reshard_after_backward:
            self.reshard()
        self.comm_ctx.land_pending_reduces()  # one reduce-scatter in flight at a time
        if not unsharded_grads:
            return
        is_hsdp = isinstance(self.mesh_info, HSDPMeshInfo)
        self._pending_reduce = foreach_reduce(
            fsdp_params_with_grad, unsharded_grads, self.mesh_info.shard_process_group, self._get_reduce_dtype(),
            self.device, self.gradient_divide_factor,
            self.mesh_info.replicate_process_group if is_hsdp else None, self.all_reduce_grads,
            self.force_sum_reduction_for_comms)
        self.comm_ctx.pending_reduce_groups.append(self)

    def _finish_reduce(self) -> None:
        pending, self._pending_reduce = self._pending_reduce, None
        if pending is None:
            return
        if self._partial_reduce_output is not None and pending.fsdp_params != self._partial_reduce_params:
            raise NotImplementedError(f"FSDP HSDP without all-reduce: the parameters with gradients changed between "
                                      f"backwards in {self._module_fqn!r}")
        self._partial_reduce_output = foreach_reduce_finish(pending, self._partial_reduce_output,
                                                            self._all_reduce_hook)
        self._partial_reduce_params = pending.fsdp_params if self._partial_reduce_output is not None else []

    def finalize_backward(self) -> None:
        self._finish_reduce()
        if self._all_gather_result is not None:  # a prefetch nobody waited for
            work = self._all_gather_result.all_gather_work
            if work is not None:
                work.wait()
            self._all_gather_result = None
        self._post_forward_indices.clear()

    def _set_unsharded_grad_dtypes(self, defer_upcast: bool) -> None:
        """Let a fresh bf16 gradient stay bf16 (the reduce-scatter copy-in upcasts it), but keep a gradient that
        accumulates across backwards (no sync) in the wider reduce dtype, as torch's."""
        for fsdp_param in self._fsdp_params_with_wider_grad_dtype:
            param = getattr(fsdp_param, "_unsharded_param", None)
            if param is None or not param.requires_grad:
                continue
            grad, dtype = param.grad, fsdp_param.unsharded_grad_dtype
            if defer_upcast:
                if grad is not None or self.reduce_grads:
                    param.grad_dtype = None
                continue
            if grad is not None and grad.dtype != dtype:
                param.grad = grad.to(dtype)
            param.grad_dtype = dtype

    def _get_reduce_dtype(self) -> torch.dtype:
        if self._reduce_dtype is not None:
            return self._reduce_dtype
        return functools.reduce(torch.promote_types, (p.unsharded_grad_dtype for p in self.fsdp_params))

    def _take_unsharded_grads_to_reduce(self) -> tuple[list[FSDPParam], list[torch.Tensor]]:
        with_grad, grads = [], []
        for fsdp_param in self.fsdp_params:
            param = getattr(fsdp_param, "_unsharded_param", None)
            if param is None or param.grad is None:
                continue
            with_grad.append(fsdp_param)
            grads.append(fsdp_param.unsharded_grad_data)
            param.grad = None
        return with_grad, grads

    def _backward_prefetch(self) -> None:
        if not self._post_forward_indices:
            return  # cleared by an earlier backward
        curr_index = self._post_forward_indices.pop()
        if curr_index > 0:
            self._prefetch_unshard(self.comm_ctx.post_forward_order[curr_index - 1], "backward")

    @staticmethod
    def _prefetch_unshard(target: FSDPParamGroup, pass_type: str) -> None:
        """Start ``target``'s all-gather without waiting: on pt_dist's group thread (``async_op=True``), where torch
        uses its all-gather CUDA stream; ``target``'s own pre-forward / pre-backward then only waits and copies."""
        state = TrainingState.PRE_BACKWARD if pass_type == "backward" else TrainingState.FORWARD
        with target.use_training_state(state):
            target.unshard(async_op=True)

    @contextlib.contextmanager
    def use_training_state(self, training_state: TrainingState):
        old, self._training_state = self._training_state, training_state
        try:
            yield
        finally:
            self._training_state = old

    def _register_post_backward_hook(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if not torch.is_grad_enabled():
            return args, kwargs
        flat, spec = pytree.tree_flatten((args, kwargs))
        indices = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not indices:
            return args, kwargs
        outs = RegisterPostBackwardFunction.apply(self, *(flat[i] for i in indices))
        for i, out in zip(indices, outs):
            flat[i] = out
        return pytree.tree_unflatten(flat, spec)

    # -- state -----------------------------------------------------------------------------------------------------

    def _to_sharded(self) -> None:
        if not self.is_sharded:
            for fsdp_param in self.fsdp_params:
                fsdp_param.to_sharded()
            self._sharded_state = ShardedState.SHARDED

    def _to_unsharded(self) -> None:
        if not self.is_unsharded:
            for fsdp_param in self.fsdp_params:
                fsdp_param.to_unsharded()
            self._sharded_state = ShardedState.UNSHARDED

    @property
    def is_sharded(self) -> bool:
        return self._sharded_state == ShardedState.SHARDED

    @property
    def is_unsharded(self) -> bool:
        return self._sharded_state == ShardedState.UNSHARDED

    @property
    def _reshard_after_forward(self) -> bool:
        return self.post_forward_mesh_info is not None

    @property
    def _all_gather_process_group(self):
        return self.mesh_info.shard_process_group

    def _with_fqn(self, label: str) -> str:
        return f"{label} ({self._module_fqn})" if self._module_fqn else label

    def __repr__(self) -> str:
        return f"FSDPParamGroup(fqn={self._module_fqn})"


def _get_param_module_infos(params: list[nn.Parameter], modules: tuple[nn.Module, ...]) -> list[ParamModuleInfo]:
    """Where each parameter is registered; a tied parameter (or a shared module) records every place."""
    params_set = set(params)
    infos: dict[nn.Parameter, ParamModuleInfo] = {}
    for module in modules:
        for submodule in module.modules(remove_duplicate=False):
            for name, param in submodule._parameters.items():
                if param is None or param not in params_set:
                    continue
                if param not in infos:
                    infos[param] = ParamModuleInfo(submodule, name)
                else:
                    infos[param].shared_modules.append(submodule)
                    infos[param].shared_param_names.append(name)
    if len(infos) != len(params):
        raise AssertionError(f"Some parameters are not in the module tree of {modules}")
    return [infos[param] for param in params]


class RegisterPostBackwardFunction(torch.autograd.Function):
    """Identity on the module's inputs; its backward (reached once their gradients, and so the parameters', are
    computed) runs the group's ``post_backward``."""

    @staticmethod
    def forward(ctx, param_group: FSDPParamGroup, *inputs: torch.Tensor):
        ctx.param_group = param_group
        return inputs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.param_group.post_backward()
        return (None, *grads)
