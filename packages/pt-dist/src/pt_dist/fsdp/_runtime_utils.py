"""``FullyShardedDataParallel``'s mechanism: each unit's parameters sharded across ranks, gathered only while the
unit runs (torch's fsdp/_runtime_utils.py hooks, here as the methods of the unit class that torch keeps in
fully_sharded_data_parallel.py).

One unit's life per iteration:

1. forward: ``unshard`` (all-gather the flat parameter; the module's parameters become views of it), run,
   ``reshard`` (FULL_SHARD frees the gathered buffer; the root keeps it, backward needs it first); with
   ``forward_prefetch`` the next unit's all-gather starts before this unit computes.
2. backward, ``_pre_backward`` (a gradient hook on the unit's outputs): gather again, and with
   ``BACKWARD_PRE`` start the previous unit's all-gather now, ahead of this unit's reduce-scatter on the queue.
3. ``_post_backward`` (the unsharded parameter's post-accumulate-grad hook): reduce-scatter the gradient, free
   the gathered buffer; the root's end-of-backward callback waits and leaves ``flat_param.grad`` a shard.

The optimizer is built over ``model.parameters()``: the flat shards. Units refer to each other (the root, the
execution order) and are called back by their handles only weakly, so a dropped model is freed at once, and with
it the gathered buffers and any shm group it kept referenced. torch's API around this (``state_dict_type``,
``summon_full_params``, optimizer state dicts, ``use_orig_params``) is the subclass users import,
pt_dist/_compat/fsdp/fully_sharded_data_parallel.py.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch import nn

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp import state_dict as _sd
from pt_dist.fsdp._common_utils import (
    FLAT_PARAM,
    FSDP_WRAPPED_MODULE,
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)
from pt_dist.fsdp._init_utils import _check_arguments, _check_offload, _init_process_groups
from pt_dist.fsdp._wrap_utils import _as_policy, _recursive_wrap
from pt_dist.fsdp.flat_param import FlatParamHandle, HandleTrainingState
from pt_dist.nn.parallel.distributed import _find_tensors
from pt_dist.utils import _broadcast_coalesced

# the strategies whose units keep their gathered parameters from forward to backward (no second all-gather)
_KEEP_AFTER_FORWARD = (ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)


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
        device_id=None,
        sync_module_states: bool = False,
        forward_prefetch: bool = False,
        limit_all_gathers: bool = True,
    ):
        super().__init__()
        _check_arguments(sharding_strategy, backward_prefetch, mixed_precision, cpu_offload)
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
        if auto_wrap_policy is not None:
            nested = [n for n, m in module.named_modules() if isinstance(m, FullyShardedDataParallel)]
            if nested:
                raise ValueError(
                    f"FullyShardedDataParallel: auto wrapping requires modules to not already have FSDP "
                    f"applied, but found {nested[0] or 'the module itself'}; wrap by hand or by policy"
                )
            kwargs = dict(
                process_group=(shard, replicate) if replicate is not None else shard,
                sharding_strategy=strategy,
                backward_prefetch=backward_prefetch,
                mixed_precision=mixed_precision,
                forward_prefetch=forward_prefetch,
                limit_all_gathers=limit_all_gathers,
                cpu_offload=cpu_offload,
                ignored_modules=ignored_modules,
            )
            _recursive_wrap(module, _as_policy(auto_wrap_policy), type(self), ignored, ignored_params,
                            only_wrap_children=True, **self._unit_kwargs(kwargs))
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
        self._handle = None
        if owned:
            self._handle = self._make_handle(owned, strategy is not ShardingStrategy.NO_SHARD)
            self._handle.on_post_backward = weak_method(self, "_post_backward")
            module.register_parameter(FLAT_PARAM, self._handle.flat_param)
            self._handle.owner = module  # (stays the owner if a wrapper replaces _fsdp_wrapped_module later)
        self._is_root: bool | None = None
        self._root_ref: weakref.ref | None = None
        self._sync_gradients = True  # False inside no_sync()
        self._forward_built_graph = False  # the last forward ran with grad enabled

    def _unit_kwargs(self, kwargs: dict) -> dict:
        """The arguments an auto-wrapped unit below this one is built with: this unit's own."""
        return kwargs

    def _make_handle(self, params: list, sharded: bool) -> FlatParamHandle:
        """This unit's flat parameter over ``params`` (``(module, attr, name, parameter)`` each)."""
        mp = self.mixed_precision
        return FlatParamHandle(params, self.process_group, self._replicate_group, sharded, mp.param_dtype,
                               mp.reduce_dtype)

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
        self._orig_buffer_dtypes = cast_buffers(self._units)

    @property
    def _root(self):
        return None if self._root_ref is None else self._root_ref()

    @property
    def _units(self) -> list:
        return [m for m in self.modules() if isinstance(m, FullyShardedDataParallel)]

    def _named_units(self):
        """``(prefix of the unit's parameters in the plain module's state dict, unit)`` for every unit (also called
        unbound on a plain module holding units)."""
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
            args, kwargs = cast_floats((args, kwargs), self.mixed_precision.param_dtype)
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
        keep = self.sharding_strategy in _KEEP_AFTER_FORWARD or (self._is_root and grad)  # root: backward is next
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

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside keep each unit's whole gradient on this rank in ``flat_param.grad``, summed, with
        no communication; the first backward outside adds it to its own and reduce-scatters the sum (torch's: on
        the root only)."""
        self._lazy_init()
        if not self._is_root:
            raise RuntimeError("`no_sync()` on inner FSDP instances is not supported. Please call `no_sync()` on root "
                               "FSDP module.")
        units = self._units
        old = [u._sync_gradients for u in units]
        for u in units:
            u._sync_gradients = False
        try:
            yield
        finally:
            for u, o in zip(units, old):
                u._sync_gradients = o

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradient norm of the whole model (the shards' norms combined over the shard group)."""
        self._lazy_init()
        grads = [u._handle.flat_param.grad for u in self._units if u._handle and u._handle.flat_param.grad is not None]
        sharded = self.sharding_strategy is not ShardingStrategy.NO_SHARD and self.process_group.size() > 1
        return clip_grad_norm_(grads, max_norm, norm_type, self.process_group if sharded else None)

    # -- state dicts (the full one by default; this rank's rows for pt_dist.checkpoint) -------------------------

    def state_dict(self, *, destination=None, prefix: str = "", keep_vars: bool = False):
        """nn.Module's protocol (``destination``, ``prefix``), so a unit inside a plain parent
        (``checkpoint_wrapper(FSDP(...))``) adds its entries to the parent's state dict under its prefix."""
        self._lazy_init()
        own = self._unit_state_dict()
        if destination is None:
            destination = type(own)()
        for k, v in own.items():
            destination[prefix + k] = v
        return destination

    def _unit_state_dict(self) -> dict:
        return _sd.full_state_dict(self)

    def load_state_dict(self, state_dict, strict: bool = True):
        self._lazy_init()
        return _sd.load_full_state_dict(self, state_dict, strict)

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

    # -- the unit stands in for the wrapped module ---------------------------------------------------------------

    @property
    def module(self) -> nn.Module:
        """The wrapped module (torch's ``FSDP.module``)."""
        return self._fsdp_wrapped_module

    @property
    def _flat_param(self):
        """This unit's flat parameter (this rank's shard), or None for a unit without parameters of its own."""
        return None if self._handle is None else self._handle.flat_param

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


# -- small pieces of the runtime ---------------------------------------------------------------------------------


def weak_method(obj, name: str):
    """``obj.<name>()`` without holding ``obj``."""
    ref = weakref.ref(obj)
    return lambda: getattr(ref(), name)()


def cast_buffers(units) -> dict:
    """At the root's first run: each unit's floating-point buffers to its ``MixedPrecision.buffer_dtype``, the
    ignored modules' left alone, as torch's; returns ``{id(buffer): (buffer, original dtype)}`` so state dicts
    save them in their own dtype again."""
    ignored = set().union(*(u._ignored for u in units))
    nested = {id(u) for u in units}
    original = {}

    def own_modules(module):
        yield module
        for child in module.children():
            if id(child) not in nested:
                yield from own_modules(child)

    for u in units:
        dtype = u.mixed_precision.buffer_dtype
        if dtype is None:
            continue
        for m in own_modules(u.module):
            if m in ignored:
                continue
            for b in m._buffers.values():
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    original[id(b)] = (b, b.dtype)
                    b.data = b.data.to(dtype)
    return original


def cast_floats(obj, dtype):
    """``obj`` (tensors in nested lists, tuples and dicts) with its floating-point tensors cast to ``dtype``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(cast_floats(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: cast_floats(v, dtype) for k, v in obj.items()}
    return obj


def clip_grad_norm_(grads: list, max_norm: float, norm_type: float, group) -> torch.Tensor:
    """Scale ``grads`` (this rank's shards) so the whole model's gradient norm is at most ``max_norm``; the
    shards' norms are combined over ``group`` (None: the gradients are whole here). Returns the total norm."""
    norm_type = float(norm_type)
    if norm_type == float("inf"):
        local = torch.stack([g.abs().max() for g in grads]).max() if grads else torch.zeros(())
        total = local.double().reshape(1)
        op = "max"
    else:
        zero = torch.zeros((), dtype=torch.float64, device=grads[0].device if grads else None)
        total = sum((g.double().abs().pow(norm_type).sum() for g in grads), zero)
        total, op = total.reshape(1), "sum"
    if group is not None:
        c10d.all_reduce(total, op=op, group=group)
    total = total[0] if norm_type == float("inf") else total[0] ** (1.0 / norm_type)
    coef = max_norm / (float(total) + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef)
    return total.to(torch.float32)
