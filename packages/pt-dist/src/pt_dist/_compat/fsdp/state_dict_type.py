"""torch's ``FullyShardedDataParallel.state_dict_type`` and what it selects (torch's fsdp/_state_dict_utils.py
beyond the core's full and sharded state dicts, pt_dist/fsdp/state_dict.py): every unit under a module carries
one state-dict type and its configs (``set_state_dict_type``, ``get_state_dict_type``, ``state_dict_type``);
``state_dict`` / ``load_state_dict`` follow it: FULL (``rank0_only`` too), SHARDED, or *local*
(``LOCAL_STATE_DICT``), each unit's flat shard without its padding (``<unit>._flat_param``, a DTensor over the
unpadded flat parameter, as torch's ShardedTensor), loadable by the same wrapping: at the same world size, or at
another once its rows are cut anew for it (torch's test_local_state_dict_reshard). And the load hooks through
which ``nn.Module.load_state_dict`` of a plain parent loads a unit (torch's ``_pre_load_state_dict_hook``)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from pt_dist._compat.fsdp._traversal_utils import fsdp_modules
from pt_dist._compat.fsdp.api import (
    OPTIM_STATE_DICT_CONFIG_TYPES,
    STATE_DICT_CONFIG_TYPES,
    StateDictSettings,
    StateDictType,
)
from pt_dist._compat.fsdp.use_orig_params import OrigParamsHandle
from pt_dist.fsdp import state_dict as _sd
from pt_dist.fsdp._common_utils import FLAT_PARAM, FSDP_WRAPPED_MODULE


def set_state_dict_type(module: nn.Module, state_dict_type: StateDictType, state_dict_config=None,
                        optim_state_dict_config=None) -> StateDictSettings:
    """Set every unit's state-dict type and configs (a config left None is the type's default); returns the
    previous settings. A config of another type's kind is a RuntimeError, as torch's."""
    if not isinstance(state_dict_type, StateDictType):
        raise TypeError(f"state_dict_type must be a StateDictType, got {state_dict_type!r}")
    want = STATE_DICT_CONFIG_TYPES[state_dict_type]
    want_optim = OPTIM_STATE_DICT_CONFIG_TYPES[state_dict_type]
    state_dict_config = want() if state_dict_config is None else state_dict_config
    optim_state_dict_config = want_optim() if optim_state_dict_config is None else optim_state_dict_config
    if type(state_dict_config) is not want:
        raise RuntimeError(f"Expected state_dict_config of type {want} but got {type(state_dict_config)}")
    if type(optim_state_dict_config) is not want_optim:
        raise RuntimeError(
            f"Expected optim_state_dict_config of type {want_optim} but got {type(optim_state_dict_config)}"
        )
    units = fsdp_modules(module)
    previous = get_state_dict_type(module) if units else StateDictSettings(None, None, None)
    for u in units:
        u._state_dict_type, u._state_dict_config = state_dict_type, state_dict_config
        u._optim_state_dict_config = optim_state_dict_config
    return previous


def get_state_dict_type(module: nn.Module) -> StateDictSettings | None:
    """The units' common settings (None without units); units that differ are an AssertionError, as torch's."""
    settings = None
    for u in fsdp_modules(module):
        mine = StateDictSettings(u._state_dict_type, u._state_dict_config, u._optim_state_dict_config)
        if settings is None:
            settings = mine
        elif mine != settings:
            raise AssertionError(f"All FSDP modules must have the same state dict settings.Got {mine} and {settings}.")
    return settings


@contextlib.contextmanager
def state_dict_type(module: nn.Module, state_dict_type: StateDictType, state_dict_config=None,
                    optim_state_dict_config=None):
    """``set_state_dict_type`` for the block, the previous settings back after it."""
    previous = set_state_dict_type(module, state_dict_type, state_dict_config, optim_state_dict_config)
    try:
        yield
    finally:
        if previous.state_dict_type is not None:
            set_state_dict_type(module, *(previous.state_dict_type, previous.state_dict_config,
                                          previous.optim_state_dict_config))


def state_dict(unit) -> dict:
    """The unit's own entries, of the type its settings say (collective)."""
    if unit._state_dict_type is StateDictType.FULL_STATE_DICT:
        return _sd.full_state_dict(unit, rank0_only=getattr(unit._state_dict_config, "rank0_only", False))
    if unit._state_dict_type is StateDictType.LOCAL_STATE_DICT:
        return local_state_dict(unit)
    return _sd.sharded_state_dict(unit)


def load_state_dict(unit, state_dict: dict, strict: bool = True):
    if unit._state_dict_type is StateDictType.FULL_STATE_DICT:
        return _sd.load_full_state_dict(unit, state_dict, strict)
    if unit._state_dict_type is StateDictType.LOCAL_STATE_DICT:
        return load_local_state_dict(unit, state_dict, strict)
    return _sd.load_sharded_state_dict(unit, state_dict, strict)


def local_state_dict(root) -> dict:
    """Each unit's flat parameter as torch's ``_local_post_state_dict_hook`` gives it: global size the unpadded
    flat parameter, this rank's rows its shard without the padding (``torch.chunk``'s rows, a DTensor)."""
    from pt_dist.tensor import DTensor, Replicate, Shard

    out = {}
    for prefix, handle in _sd._units(root):
        start, n = _local_rows(handle)
        placements = [Shard(0) if handle.sharded else Replicate()]
        out[prefix + FLAT_PARAM] = DTensor.from_local(
            handle.flat_param.detach().narrow(0, 0, n).clone(), _sd._shard_mesh(handle), placements, run_check=False,
            shape=(handle.numel if handle.sharded else handle.shard_numel,), stride=(1,))
    out.update({name: t.detach() for name, t in _sd._other_states(root)})
    return out


def _local_rows(handle) -> tuple[int, int]:
    """(first element, count) of the unpadded flat parameter that this rank's shard holds."""
    if not handle.sharded:
        return 0, handle.shard_numel
    start = handle.shard_group.rank() * handle.shard_numel
    return start, max(0, min(handle.shard_numel, handle.numel - start))


def _load_local_flat(handle, name: str, value) -> None:
    """A LOCAL entry into the flat shard: a DTensor whose rows here are this shard's (resharded by hand for this
    world, as torch's test_local_state_dict_reshard does, or saved by it), padding zeroed; or the shard itself."""
    if _sd._is_dtensor(value):
        from pt_dist.tensor._utils import compute_local_shape_and_global_offset

        sizes, offsets = compute_local_shape_and_global_offset(value.shape, value.device_mesh, value.placements)
        start, n = _local_rows(handle)
        local = value.to_local()
        if tuple(value.shape) != ((handle.numel if handle.sharded else handle.shard_numel),) or (
                handle.sharded and (sizes[0] != n or n and offsets[0] != start)):  # (an empty one sits at the end)
            raise ValueError(
                f"FullyShardedDataParallel.load_state_dict: {name!r} holds rows {offsets[0]}..{offsets[0] + sizes[0]}"
                f" of {tuple(value.shape)}, this rank's shard is {start}..{start + n} of ({handle.numel},) (saved by "
                f"a different number of ranks?)")
        value = torch.cat([local.reshape(-1), local.new_zeros(handle.shard_numel - local.numel())])
    _sd._check_shape(name, value, handle.flat_param.shape, "(saved by a different number of ranks?)")
    handle.flat_param.copy_(value)


def load_local_state_dict(root, state_dict: dict, strict: bool = True):
    handles = {prefix + FLAT_PARAM: handle for prefix, handle in _sd._units(root)}
    others = dict(_sd._other_states(root))
    keys = _sd._check_keys(state_dict, set(handles) | set(others), strict)
    with torch.no_grad():
        for name, handle in handles.items():
            if name in state_dict:
                _load_local_flat(handle, name, state_dict[name])
        for name, target in others.items():
            if name in state_dict:
                value = state_dict[name].to_local() if _sd._is_dtensor(state_dict[name]) else state_dict[name]
                _sd._check_shape(name, value, target.shape)
                target.copy_(value)
    return keys


def pre_load_state_dict_hook(unit, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
    """``nn.Module.load_state_dict`` of a plain parent reaching a unit (torch's ``_pre_load_state_dict_hook``):
    this unit's own parameters, under the plain names after ``prefix``, are taken out and cut into its shard
    (a DTensor value, SHARDED_STATE_DICT's, gathered first; LOCAL_STATE_DICT's one flat shard copied); what is
    left under ``prefix`` moves under the wrapped module's name, so the walk on loads the buffers, the ignored
    modules' parameters and the nested units' entries where they are."""
    if local_metadata.get("assign_to_params_buffers"):
        raise NotImplementedError(f"FullyShardedDataParallel at {prefix!r}: load_state_dict(assign=True) cannot "
                                  f"assign into a flat parameter; load without assign")
    unit._lazy_init()
    handle = unit._handle
    if handle is not None and unit._state_dict_type is StateDictType.LOCAL_STATE_DICT:
        if prefix + FLAT_PARAM in state_dict:
            with torch.no_grad():
                _load_local_flat(handle, prefix + FLAT_PARAM, state_dict.pop(prefix + FLAT_PARAM))
        else:
            missing.append(prefix + FLAT_PARAM)
    elif handle is not None:
        flat = handle.flat_param.new_zeros(handle.numel)
        with torch.no_grad():
            for info in handle.infos:
                name = _sd._name(prefix, info)
                if name not in state_dict:
                    missing.append(name)
                    continue
                value = _sd._gathered(state_dict.pop(name), handle)
                _sd._check_shape(name, value, info.shape)
                flat.narrow(0, info.offset, info.numel).copy_(value.reshape(-1))
            handle.load_full_flat(flat)
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[f"{prefix}{FSDP_WRAPPED_MODULE}.{key[len(prefix):]}"] = state_dict.pop(key)
    loaded = {f"{prefix}{FSDP_WRAPPED_MODULE}.{FLAT_PARAM}"}
    if isinstance(handle, OrigParamsHandle):  # the originals, registered where the walk goes on
        loaded |= {f"{prefix}{FSDP_WRAPPED_MODULE}.{info.fqn}" for info in handle.infos}
    unit.__dict__["_loading_flat_keys"] = loaded


def post_load_state_dict_hook(unit, incompatible) -> None:
    """The walk's default loading of the wrapped module counted the flat parameter missing (a plain module's
    state dict never holds it), and with ``use_orig_params`` the originals the pre-hook loaded already."""
    keys = unit.__dict__.pop("_loading_flat_keys", set())
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in keys]
