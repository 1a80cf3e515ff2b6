"""``FullyShardedDataParallel``: each unit's parameters sharded across ranks, gathered only while the unit runs.

torch's FSDP (torch/distributed/fsdp/fully_sharded_data_parallel.py, with _runtime_utils.py's hooks), one unit's
life per iteration:

1. forward: ``unshard`` (all-gather the flat parameter; the module's parameters become views of it), run,
   ``reshard`` (FULL_SHARD frees the gathered buffer; the root keeps it, backward needs it first); with
   ``forward_prefetch`` the next unit's all-gather starts before this unit computes.
2. backward, ``_pre_backward`` (a gradient hook on the unit's outputs): gather again, and with
   ``BACKWARD_PRE`` start the previous unit's all-gather now, ahead of this unit's reduce-scatter on the queue.
3. ``_post_backward`` (the unsharded parameter's post-accumulate-grad hook): reduce-scatter the gradient, free
   the gathered buffer; the root's end-of-backward callback waits and leaves ``flat_param.grad`` a shard.

The optimizer is built over ``model.parameters()``: the flat shards (``use_orig_params=True``: the module's own
parameters, views of them; _orig_params.py). Units refer to each other (the root, the
execution order) and are called back by their handles only weakly, so a dropped model is freed at once, and with
it the gathered buffers and any shm group it kept referenced.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from pt_dist.fsdp import _optim_utils as _optim
from pt_dist.fsdp import _runtime_utils as _rt
from pt_dist.fsdp import _state_dict_settings as _settings
from pt_dist.fsdp import _unshard_param_utils as _unshard
from pt_dist.fsdp import state_dict as _sd
from pt_dist.fsdp._init_utils import _check_arguments, _check_offload, _init_process_groups
from pt_dist.fsdp._orig_params import flat_params_exposed
from pt_dist.fsdp.api import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    MixedPrecision,
    ShardingStrategy,
    StateDictType,
)
from pt_dist.fsdp.flat_param import FlatParamHandle, HandleTrainingState
from pt_dist.fsdp.wrap import _as_policy, _recursive_wrap
from pt_dist.nn.parallel.distributed import _find_tensors
from pt_dist.utils import _broadcast_coalesced

FSDP_WRAPPED_MODULE = "_fsdp_wrapped_module"
FLAT_PARAM = "_flat_param"


class FullyShardedDataParallel(nn.Module):
    """Shard ``module``'s parameters, gradients and optimizer state over the ranks of ``process_group``."""

    def __init__(
        self,
        module: nn.Module,
        process_group=None,
        sharding_strategy: ShardingStrategy | None = None,
        cpu_offload: CPUOffload | None = None,
        auto_wrap_policy=None,
        backward_prefetch: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE,
        mixed_precision: MixedPrecision | None = None,
        ignored_modules=None,
        param_init_fn=None,
        device_id=None,
        sync_module_states: bool = False,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
        use_orig_params: bool = False,
        ignored_states=None,
        device_mesh=None,
    ):
        super().__init__()
        _check_arguments(
            sharding_strategy,
            backward_prefetch,
            mixed_precision,
            cpu_offload,
            param_init_fn,
            device_id,
            use_orig_params,
            ignored_states,
            device_mesh,
        )
        strategy = sharding_strategy or ShardingStrategy.FULL_SHARD
        shard, replicate = _init_process_groups(process_group, strategy)
        ignored = {m for root in (ignored_modules or []) for m in root.modules()}
        ignored_params = {p for m in ignored for p in m.parameters()}
        if device_id is not None:  # as torch's: the module moves there first (an int is that CUDA device)
            module.to(torch.device("cuda", device_id) if isinstance(device_id, int) else torch.device(device_id))
        _check_offload(module, cpu_offload)
        if sync_module_states:  # rank 0's values everywhere, before anything is sharded
            states = [t.detach() for t in (*module.parameters(), *module.buffers())]
            for group in (shard, replicate):
                if group is not None:
                    _broadcast_coalesced(group, states, 250 * 1024 * 1024, 0)
        kwargs = dict(
            process_group=(shard, replicate) if replicate is not None else shard,
            sharding_strategy=strategy,
            backward_prefetch=backward_prefetch,
            mixed_precision=mixed_precision,
            forward_prefetch=forward_prefetch,
            limit_all_gathers=limit_all_gathers,
            cpu_offload=cpu_offload,
            ignored_modules=ignored_modules,
            use_orig_params=use_orig_params,
        )
        if auto_wrap_policy is not None:
            nested = [n for n, m in module.named_modules() if isinstance(m, FullyShardedDataParallel)]
            if nested:
                raise ValueError(
                    f"FullyShardedDataParallel: auto wrapping requires modules to not already have FSDP "
                    f"applied, but found {nested[0] or 'the module itself'}; wrap by hand or by policy"
                )
            _recursive_wrap(
                module,
                _as_policy(auto_wrap_policy),
                FullyShardedDataParallel,
                ignored,
                ignored_params,
                only_wrap_children=True,
                **kwargs,
            )
        self._fsdp_wrapped_module = module
        self.sharding_strategy, self.backward_prefetch, self.forward_prefetch = (
            strategy,
            backward_prefetch,
            forward_prefetch,
        )
        self.mixed_precision, self.limit_all_gathers = mixed_precision or MixedPrecision(), limit_all_gathers
        self.cpu_offload = cpu_offload or CPUOffload()
        self.process_group, self._replicate_group = shard, replicate
        self._dp_world = shard.size() * (replicate.size() if replicate is not None else 1)
        self._ignored = ignored  # (a unit that ignores its own module manages none of its parameters, as torch's)
        owned = [] if module in ignored else list(_owned_parameters(module, ignored))
        self._handle, self._use_orig_params = None, use_orig_params
        if owned:
            mp = self.mixed_precision
            self._handle = FlatParamHandle(
                owned, shard, replicate, strategy is not ShardingStrategy.NO_SHARD, mp.param_dtype, mp.reduce_dtype,
                use_orig_params,
            )
            self._handle.on_post_backward = _rt.weak_method(self, "_post_backward")
            if not use_orig_params:  # (with them, the flat parameter is no module's parameter, as torch's)
                module.register_parameter(FLAT_PARAM, self._handle.flat_param)
            self._handle.owner = module  # (stays the owner if a wrapper replaces _fsdp_wrapped_module later)
        self._is_root: bool | None = None
        self._root_ref: weakref.ref | None = None
        self._state_dict_type, self._state_dict_config = StateDictType.FULL_STATE_DICT, FullStateDictConfig()
        self._sync_gradients = True  # False inside no_sync()
        self._forward_built_graph = False  # the last forward ran with grad enabled
        self._optim_state_dict_config = FullOptimStateDictConfig()
        self.register_load_state_dict_pre_hook(_sd.pre_load_state_dict_hook)  # a plain parent's load_state_dict
        self.register_load_state_dict_post_hook(_sd.post_load_state_dict_hook)

    # -- the root ------------------------------------------------------------------------------------------------

    def _lazy_init(self) -> None:
        """The first unit to run (or to be asked for a state dict) is the root: it knows every unit below it."""
        if self._is_root is not None:
            return
        for _, m in self._named_units():
            m._is_root, m._root_ref = m is self, weakref.ref(self)
        self._exec_order: list[weakref.ref] = []  # the units in their first forward's order
        self._order_frozen, self._final_queued = False, False
        self._reduce_order: list[FlatParamHandle] = []
        self._orig_buffer_dtypes = _rt.cast_buffers(self._units)

    @property
    def _root(self):
        return None if self._root_ref is None else self._root_ref()

    @property
    def _units(self) -> list:
        return [m for m in self.modules() if isinstance(m, FullyShardedDataParallel)]

    def _named_units(self):
        """``(prefix of the unit's parameters in the plain module's state dict, unit)`` for every unit."""
        for name, m in self.named_modules():
            if isinstance(m, FullyShardedDataParallel):
                clean = name.replace(f"{FSDP_WRAPPED_MODULE}.", "").replace(FSDP_WRAPPED_MODULE, "").rstrip(".")
                yield (f"{clean}." if clean else ""), m

    def _neighbour(self, unit, step: int):
        order, me = self._exec_order, weakref.ref(unit)  # (weak references compare by their referents)
        if not self._order_frozen or me not in order:
            return None
        i = order.index(me) + step
        other = order[i]() if 0 <= i < len(order) else None
        return other if other is not None and other._handle is not None else None

    # -- forward -------------------------------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        self._lazy_init()
        root, handle = self._root, self._handle
        if (
            self._is_root
            and self.mixed_precision.param_dtype is not None
            and self.mixed_precision.cast_root_forward_inputs
        ):
            args, kwargs = _rt.cast_floats((args, kwargs), self.mixed_precision.param_dtype)
        if self._is_root and torch._C._current_graph_task_id() == -1:
            for unit in self._units:  # what the user did to the original parameters since (torch's writeback)
                if unit._handle is not None and unit._handle.orig is not None:
                    unit._handle.orig.writeback_params()
        if handle is None:
            out = self._fsdp_wrapped_module(*args, **kwargs)
            if self._is_root:  # (a root of wrapped units alone: the order is known after its first forward too)
                self._order_frozen = True
            return out
        if torch._C._current_graph_task_id() != -1:  # a checkpoint re-running this unit inside backward
            handle.unshard()
            fresh = torch.is_grad_enabled() and handle.requires_grad and not self._forward_built_graph
            # fresh: a reentrant checkpoint, whose forward ran without grad; the graph built now is the one its
            # backward runs, so the gradient hook goes on a new leaf here (and the end-of-backward callback)
            handle.use_unsharded_views(new_leaf=fresh)
            if fresh:
                self._pre_backward()
            return self._fsdp_wrapped_module(*args, **kwargs)
        grad = self._forward_built_graph = torch.is_grad_enabled()
        handle.state = HandleTrainingState.FORWARD
        handle.unshard()
        handle.use_unsharded_views(new_leaf=grad)
        if not root._order_frozen and weakref.ref(self) not in root._exec_order:
            root._exec_order.append(weakref.ref(self))
        nxt = root._neighbour(self, +1) if self.forward_prefetch else None
        if nxt is not None:
            nxt._handle.unshard(async_op=True)  # overlaps this unit's compute
        out = self._fsdp_wrapped_module(*args, **kwargs)
        if grad and handle.requires_grad:
            for t in _find_tensors(out):
                if t.requires_grad:
                    t.register_hook(self._pre_backward_hook)
        keep = self.sharding_strategy in (ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD) or (
            self._is_root and grad
        )  # the root's backward starts at once
        if not keep or not grad:
            handle.reshard()
        handle.state = HandleTrainingState.IDLE
        if self._is_root:
            self._order_frozen = True
        return out

    # -- backward ------------------------------------------------------------------------------------------------

    def _pre_backward_hook(self, grad):
        self._pre_backward()

    def _pre_backward(self) -> None:
        handle, root = self._handle, self._root
        if handle.state in (HandleTrainingState.BACKWARD_PRE, HandleTrainingState.BACKWARD_POST):
            return
        if not root._final_queued:
            root._final_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(root._post_backward_final_callback)
        handle.state = HandleTrainingState.BACKWARD_PRE
        handle.unshard()
        if self.backward_prefetch is BackwardPrefetch.BACKWARD_PRE:
            self._prefetch_previous()

    def _prefetch_previous(self) -> None:
        prev = self._root._neighbour(self, -1)
        if prev is not None and prev._handle.state is not HandleTrainingState.BACKWARD_POST:
            prev._handle.unshard(async_op=True)

    def _post_backward(self) -> None:
        handle = self._handle
        handle.post_backward_calls += 1
        if handle.post_backward_calls > 1:
            raise RuntimeError(
                "FullyShardedDataParallel: a unit's gradient arrived in two parts (a reentrant "
                "activation checkpoint inside it); use torch.utils.checkpoint with use_reentrant=False"
            )
        if self._sync_gradients:
            handle.reduce_grad(self._dp_world)
            self._root._reduce_order.append(handle)
        else:
            handle.keep_unsharded_grad()
        if self.sharding_strategy is not ShardingStrategy.NO_SHARD:
            handle.reshard()
        handle.state = HandleTrainingState.BACKWARD_POST
        if self.backward_prefetch is BackwardPrefetch.BACKWARD_POST:
            self._prefetch_previous()

    def _post_backward_final_callback(self) -> None:
        """End of the whole backward: every unit's gradient shard in ``.grad``, every unit resharded."""
        for handle in self._reduce_order:
            handle.finish_reduce()
        self._reduce_order.clear()
        for unit in self._units:
            h = unit._handle
            if h is not None:
                if h.is_unsharded or h._gather is not None:
                    h.reshard()
                h.state = HandleTrainingState.IDLE
        self._final_queued = False

    # -- the rest of torch's FSDP API ----------------------------------------------------------------------------

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradient norm of the whole model (the shards' norms combined over the shard group)."""
        self._lazy_init()
        for h in (u._handle for u in self._units if u._handle is not None and u._handle.orig is not None):
            h.orig.writeback_grads()  # (use_orig_params: what the originals' gradients say, views of the flat one)
            h.orig.use_grad_views()
        grads = [u._handle.flat_param.grad for u in self._units if u._handle and u._handle.flat_param.grad is not None]
        sharded = self.sharding_strategy is not ShardingStrategy.NO_SHARD and self.process_group.size() > 1
        return _rt.clip_grad_norm_(grads, max_norm, norm_type, self.process_group if sharded else None)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """nn.Module's protocol (``destination``, ``prefix``; positionally too), so a unit inside a plain parent
        (``checkpoint_wrapper(FSDP(...))``) adds its entries to the parent's state dict under its prefix."""
        if args:  # nn.Module's deprecated positional form: (destination, prefix, keep_vars)
            destination, prefix, keep_vars = (list(args) + [destination, prefix, keep_vars][len(args):])[:3]
        self._lazy_init()
        if self._state_dict_type is StateDictType.FULL_STATE_DICT:
            own = _sd.full_state_dict(self, rank0_only=getattr(self._state_dict_config, "rank0_only", False))
        elif self._state_dict_type is StateDictType.LOCAL_STATE_DICT:
            own = _sd.local_state_dict(self)
        else:
            own = _sd.sharded_state_dict(self)
        if destination is None:
            destination = type(own)()
        for k, v in own.items():
            destination[prefix + k] = v
        return destination

    def load_state_dict(self, state_dict, strict: bool = True):
        self._lazy_init()
        if self._state_dict_type is StateDictType.FULL_STATE_DICT:
            return _sd.load_full_state_dict(self, state_dict, strict)
        if self._state_dict_type is StateDictType.LOCAL_STATE_DICT:
            return _sd.load_local_state_dict(self, state_dict, strict)
        return _sd.load_sharded_state_dict(self, state_dict, strict)

    def full_state_dict(self, rank0_only: bool = False) -> dict:
        """The whole model's state under the plain module's names (collective); ``{}`` off rank 0 if rank0_only."""
        self._lazy_init()
        return _sd.full_state_dict(self, rank0_only)

    def sharded_state_dict(self) -> dict:
        """``SHARDED_STATE_DICT``'s: each parameter a DTensor holding this rank's rows, and the buffers (collective);
        what ``pt_dist.checkpoint.save`` saves."""
        self._lazy_init()
        return _sd.sharded_state_dict(self)

    def load_sharded_state_dict(self, state_dict, strict: bool = True):
        self._lazy_init()
        return _sd.load_sharded_state_dict(self, state_dict, strict)

    state_dict_type = staticmethod(_settings.state_dict_type)
    set_state_dict_type = staticmethod(_settings.set_state_dict_type)
    get_state_dict_type = staticmethod(_settings.get_state_dict_type)
    fsdp_modules = staticmethod(_settings.fsdp_modules)
    summon_full_params = staticmethod(_unshard.summon_full_params)
    optim_state_dict = staticmethod(_optim.optim_state_dict)
    optim_state_dict_to_load = staticmethod(_optim.optim_state_dict_to_load)
    full_optim_state_dict = staticmethod(_optim.full_optim_state_dict)
    shard_full_optim_state_dict = staticmethod(_optim.shard_full_optim_state_dict)
    sharded_optim_state_dict = staticmethod(_optim.sharded_optim_state_dict)
    flatten_sharded_optim_state_dict = staticmethod(_optim.flatten_sharded_optim_state_dict)
    scatter_full_optim_state_dict = staticmethod(_optim.scatter_full_optim_state_dict)
    rekey_optim_state_dict = staticmethod(_optim.rekey_optim_state_dict)

    def no_sync(self):
        return _unshard.no_sync(self)

    def _apply(self, fn, *args, **kwargs):
        with flat_params_exposed(self._units):  # (use_orig_params: the flat shards are what converts)
            return super()._apply(fn, *args, **kwargs)

    def named_parameters(self, *args, **kwargs):
        """Inside ``summon_full_params`` the plain module's names (FSDP's prefixes dropped), as torch's."""
        clean = getattr(self, "_summoned", False)
        for name, p in super().named_parameters(*args, **kwargs):
            yield (name.replace(FSDP_WRAPPED_MODULE + ".", "") if clean else name), p

    @property
    def module(self) -> nn.Module:
        """The wrapped module (torch's ``FSDP.module``)."""
        return self._fsdp_wrapped_module

    @property
    def _flat_param(self):
        """This unit's flat parameter (this rank's shard), or None for a unit without parameters of its own."""
        return None if self._handle is None else self._handle.flat_param

    @property
    def rank(self) -> int:
        return self.process_group.rank()

    @property
    def world_size(self) -> int:
        return self.process_group.size()

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == FSDP_WRAPPED_MODULE:
                raise
            return getattr(self._fsdp_wrapped_module, name)

    def __getitem__(self, key):
        return self._fsdp_wrapped_module.__getitem__(key)


def _owned_parameters(module: nn.Module, ignored: set, prefix: str = ""):
    """``(module, attr, name within the unit, parameter)`` for each parameter this unit flattens, in
    ``named_parameters`` order: not in a nested unit, not ignored; a parameter two modules share appears twice."""
    for name, p in list(module._parameters.items()):
        if p is not None:
            yield module, name, f"{prefix}{name}", p
    for child_name, child in module._modules.items():  # (a module shared under two names: both, as torch's)
        if child is not None and not isinstance(child, FullyShardedDataParallel) and child not in ignored:
            yield from _owned_parameters(child, ignored, f"{prefix}{child_name}.")
