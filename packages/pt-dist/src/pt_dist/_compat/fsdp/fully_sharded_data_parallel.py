"""``FullyShardedDataParallel`` as torch's FSDP1 class is used (torch/distributed/fsdp/fully_sharded_data_parallel.py):
the core unit (pt_dist/fsdp/_runtime_utils.py) with torch's constructor and API around it.

- the constructor's whole signature: ``use_orig_params`` (the original parameters kept as views of the flat
  shard, use_orig_params.py; chosen here, at the handle), and the arguments pt_dist refuses
  (``param_init_fn``, ``ignored_states``, ``device_mesh``);
- ``state_dict_type`` / ``set_state_dict_type`` / ``get_state_dict_type`` / ``fsdp_modules`` and the state dict
  each type selects (state_dict_type.py), with the load hooks a plain parent's ``load_state_dict`` goes through;
- ``summon_full_params`` (summon_full_params.py);
- optimizer state dicts: ``optim_state_dict``, ``optim_state_dict_to_load`` and torch's older spellings
  (optim_state_dict.py);
- ``rank``, ``world_size``, and ``named_parameters`` under the plain names inside ``summon_full_params``.
"""

from __future__ import annotations

import torch

from pt_dist._compat.fsdp import optim_state_dict as _optim
from pt_dist._compat.fsdp import state_dict_type as _sdt
from pt_dist._compat.fsdp import summon_full_params as _summon
from pt_dist._compat.fsdp._traversal_utils import fsdp_modules
from pt_dist._compat.fsdp.api import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from pt_dist._compat.fsdp.use_orig_params import OrigParamsHandle, flat_params_exposed, orig_handles
from pt_dist._compat.fsdp.wrap import _POLICY_KWARGS
from pt_dist.fsdp import _runtime_utils
from pt_dist.fsdp._common_utils import FLAT_PARAM, FSDP_WRAPPED_MODULE, BackwardPrefetch, ShardingStrategy
from pt_dist.fsdp.flat_param import FlatParamHandle


class FullyShardedDataParallel(_runtime_utils.FullyShardedDataParallel):
    """Shard ``module``'s parameters, gradients and optimizer state over the ranks of ``process_group``."""

    def __init__(
        self,
        module,
        process_group=None,
        sharding_strategy=None,
        cpu_offload=None,
        auto_wrap_policy=None,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        mixed_precision=None,
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
        custom = module.__dict__.pop(_POLICY_KWARGS, None)
        if custom:  # a unit CustomPolicy gave arguments of its own (torch's: over the root's)
            given = dict(process_group=process_group, sharding_strategy=sharding_strategy, cpu_offload=cpu_offload,
                         auto_wrap_policy=auto_wrap_policy, backward_prefetch=backward_prefetch,
                         mixed_precision=mixed_precision, ignored_modules=ignored_modules, param_init_fn=param_init_fn,
                         device_id=device_id, sync_module_states=sync_module_states, forward_prefetch=forward_prefetch,
                         limit_all_gathers=limit_all_gathers, use_orig_params=use_orig_params,
                         ignored_states=ignored_states, device_mesh=device_mesh)
            unknown = set(custom) - set(given)
            if unknown:
                raise TypeError(f"FullyShardedDataParallel: CustomPolicy gave unknown arguments {sorted(unknown)}")
            self.__init__(module, **{**given, **custom})
            return
        for name, value in (("param_init_fn", param_init_fn), ("ignored_states", ignored_states)):
            if value is not None:
                raise ValueError(f"FullyShardedDataParallel: {name} is not supported, got {value!r}")
        if device_mesh is not None:
            process_group = _groups_of_mesh(device_mesh, process_group, sharding_strategy)
        if not isinstance(use_orig_params, bool):
            raise TypeError(f"FullyShardedDataParallel: use_orig_params must be a bool, got {use_orig_params!r}")
        self._use_orig_params = use_orig_params  # (read by _make_handle and _unit_kwargs as the core builds)
        super().__init__(
            module, process_group=process_group, sharding_strategy=sharding_strategy, cpu_offload=cpu_offload,
            auto_wrap_policy=auto_wrap_policy, backward_prefetch=backward_prefetch, mixed_precision=mixed_precision,
            ignored_modules=ignored_modules, device_id=device_id, sync_module_states=sync_module_states,
            forward_prefetch=forward_prefetch, limit_all_gathers=limit_all_gathers,
        )
        if isinstance(self._handle, OrigParamsHandle):  # the originals are the module's parameters, as torch's
            del module._parameters[FLAT_PARAM]
        self._state_dict_type, self._state_dict_config = StateDictType.FULL_STATE_DICT, FullStateDictConfig()
        self._optim_state_dict_config = FullOptimStateDictConfig()
        self.register_load_state_dict_pre_hook(_sdt.pre_load_state_dict_hook)  # a plain parent's load_state_dict
        self.register_load_state_dict_post_hook(_sdt.post_load_state_dict_hook)

    def _unit_kwargs(self, kwargs: dict) -> dict:
        return {**kwargs, "use_orig_params": self._use_orig_params}

    def _make_handle(self, params: list, sharded: bool) -> FlatParamHandle:
        if not self._use_orig_params:
            return _name_views(super()._make_handle(params, sharded))
        mp = self.mixed_precision
        return OrigParamsHandle(params, self.process_group, self._replicate_group, sharded, mp.param_dtype,
                                mp.reduce_dtype)

    # -- use_orig_params: what the user did to the originals, carried into the flat shards -----------------------

    def forward(self, *args, **kwargs):
        self._lazy_init()
        if self._is_root and torch._C._current_graph_task_id() == -1:  # (torch's _writeback_orig_params)
            for handle in orig_handles(self._units):
                handle.writeback_params()
        return super().forward(*args, **kwargs)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        self._lazy_init()
        for handle in orig_handles(self._units):  # what the originals' gradients say, views of the flat one again
            handle.writeback_grads()
            handle.use_grad_views()
        return super().clip_grad_norm_(max_norm, norm_type)

    def _apply(self, fn, *args, **kwargs):
        with flat_params_exposed(self._units):  # (the flat shards are what model.half() / .to() convert)
            return super()._apply(fn, *args, **kwargs)

    # -- state dicts of the type state_dict_type selects ---------------------------------------------------------

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """Also nn.Module's deprecated positional form, ``state_dict(destination, prefix, keep_vars)``."""
        if args:
            destination, prefix, keep_vars = (list(args) + [destination, prefix, keep_vars][len(args):])[:3]
        return super().state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def _unit_state_dict(self) -> dict:
        return _sdt.state_dict(self)

    def load_state_dict(self, state_dict, strict: bool = True):
        self._lazy_init()
        return _sdt.load_state_dict(self, state_dict, strict)

    state_dict_type = staticmethod(_sdt.state_dict_type)
    set_state_dict_type = staticmethod(_sdt.set_state_dict_type)
    get_state_dict_type = staticmethod(_sdt.get_state_dict_type)
    fsdp_modules = staticmethod(fsdp_modules)
    summon_full_params = staticmethod(_summon.summon_full_params)
    optim_state_dict = staticmethod(_optim.optim_state_dict)
    optim_state_dict_to_load = staticmethod(_optim.optim_state_dict_to_load)
    full_optim_state_dict = staticmethod(_optim.full_optim_state_dict)
    shard_full_optim_state_dict = staticmethod(_optim.shard_full_optim_state_dict)
    sharded_optim_state_dict = staticmethod(_optim.sharded_optim_state_dict)
    flatten_sharded_optim_state_dict = staticmethod(_optim.flatten_sharded_optim_state_dict)
    scatter_full_optim_state_dict = staticmethod(_optim.scatter_full_optim_state_dict)
    rekey_optim_state_dict = staticmethod(_optim.rekey_optim_state_dict)

    def named_parameters(self, *args, **kwargs):
        """Inside ``summon_full_params`` the plain module's names (FSDP's prefixes dropped), as torch's."""
        clean = getattr(self, "_summoned", False)
        for name, p in super().named_parameters(*args, **kwargs):
            yield (name.replace(FSDP_WRAPPED_MODULE + ".", "") if clean else name), p

    def register_comm_hook(self, state: object, hook: callable) -> None:
        """Every unit's gradient reduction done by ``hook(state, grad[, output])`` instead (the root only, before
        training; not with the hybrid strategies), as torch's; default hooks in
        ``pt_dist.algorithms._comm_hooks.default_hooks``."""
        if not self.check_is_root():
            raise AssertionError("register_comm_hook can only be called on a root instance.")
        for unit in self._units:
            if unit.sharding_strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
                raise AssertionError(f"Communication hook is not supported for hybrid strategies: "
                                     f"{unit.sharding_strategy}")
            if unit._handle is not None and unit._handle.comm_hook is not None:
                raise AssertionError("A communication hook is already registered")
            if not callable(hook):
                raise ValueError(f"The communication hook must be callable but got {hook}")
        for unit in self._units:
            if unit._handle is not None:
                unit._handle.comm_hook = (state, hook)

    def check_is_root(self) -> bool:
        """Whether this unit is the root (the first one run, or asked, decides it, as torch's)."""
        self._lazy_init()
        return bool(self._is_root)

    @property
    def rank(self) -> int:
        return self.process_group.rank()

    @property
    def world_size(self) -> int:
        return self.process_group.size()


def _name_views(handle: FlatParamHandle) -> FlatParamHandle:
    """Leave each original parameter name reachable, as torch's ``FlatParamHandle`` does: a plain-tensor view of
    the unit's gathered buffer, holding the full values whenever the unit is unsharded (forward, backward,
    ``summon_full_params``) and no memory otherwise (its data is not to be read then, as torch's)."""
    storage = handle._full.untyped_storage()
    storage.resize_(handle._full_bytes())
    whole = torch.empty(0, dtype=handle.param_dtype, device=handle.device).set_(storage, 0, (handle.numel,), (1,))
    handle._setattr_views(handle.views_of(whole))
    storage.resize_(0)
    return handle


def _groups_of_mesh(device_mesh, process_group, sharding_strategy):
    """``device_mesh=`` as torch's: a 1-D mesh's group, or for the hybrid strategies a 2-D mesh's (shard group =
    mesh dim 1, replicate group = mesh dim 0)."""
    if process_group is not None:
        raise ValueError("Cannot pass both process_group and device_mesh at the same time. Please only pass one "
                         "of them.")
    hybrid = sharding_strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
    if device_mesh.ndim != (2 if hybrid else 1):
        raise ValueError(f"FullyShardedDataParallel: {sharding_strategy} takes a {2 if hybrid else 1}-D "
                         f"device_mesh, got {device_mesh}")
    return (device_mesh.get_group(1), device_mesh.get_group(0)) if hybrid else device_mesh.get_group(0)
