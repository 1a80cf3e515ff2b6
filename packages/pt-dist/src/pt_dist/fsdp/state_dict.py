"""FSDP state dicts (torch's fsdp/_state_dict_utils.py): *full*, every unit's flat parameter gathered and cut back
into the plain module's parameters under their plain names (so ``plain_model.load_state_dict`` takes it);
*sharded* (``SHARDED_STATE_DICT``), the same names, each parameter a DTensor over its unit's shard group holding
this rank's rows (``Shard(0)``, cut as ``torch.chunk``: torch's ``_ext_chunk_dtensor``), which is what
``pt_dist.checkpoint.save`` saves so it loads at any world size, or into a plain model; and *local*
(``LOCAL_STATE_DICT``), each unit's flat shard without its padding (``<unit>._flat_param``, a DTensor over the
unpadded flat parameter, as torch's ShardedTensor), loadable by the same wrapping: at the same world size, or
at another once its rows are cut anew for it (torch's test_local_state_dict_reshard)."""

from __future__ import annotations

import torch
from torch.nn.modules.module import _IncompatibleKeys

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp._runtime_utils import saved_buffer

FLAT_PARAM = "_flat_param"


def _clean(name: str) -> str:
    """The plain module's name: FSDP's and ``checkpoint_wrapper``'s wrapper prefixes dropped (torch's
    ``clean_tensor_name``), so ``FSDP(checkpoint_wrapper(layer))`` saves the names ``FSDP(layer)`` does."""
    return name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")


def _other_states(root):
    """Persistent buffers and the parameters FSDP does not flatten (ignored modules'), under the plain module's
    names (non-persistent buffers, such as rotary embeddings' ``inv_freq``, stay out, as in ``nn.Module``'s). State
    dicts hold them detached, not cloned, as torch's (only the gathered parameters are copies)."""
    for prefix, module in root.named_modules():
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                yield _clean(f"{prefix}.{name}" if prefix else name), b
    owned = {id(p) for u in root._units if u._handle is not None and u._handle.orig is not None
             for p in u._handle.orig.params}  # (use_orig_params: the units' own, saved through their handles)
    for name, p in root.named_parameters():
        if not name.endswith(FLAT_PARAM) and id(p) not in owned:
            yield _clean(name), p


def _units(root):
    return [(_clean(prefix), u._handle) for prefix, u in root._named_units() if u._handle is not None]


def _name(prefix: str, info) -> str:
    return prefix + _clean(info.fqn)


def full_state_dict(root, rank0_only: bool = False) -> dict:
    """Collective over each unit's shard group: every rank gathers; with ``rank0_only`` only global rank 0 keeps."""
    keep = not rank0_only or c10d.get_rank() == 0
    out = {}
    for prefix, handle in _units(root):
        flat = handle.full_flat()
        if keep:
            for info in handle.infos:
                out[_name(prefix, info)] = flat.narrow(0, info.offset, info.numel).view(info.shape).clone()
    if keep:
        out.update({name: saved_buffer(root, t) for name, t in _other_states(root)})
    return out


def load_full_state_dict(root, state_dict: dict, strict: bool = True):
    """A full state dict (every rank holds it all) cut into this rank's shards; no communication."""
    expected = {_name(prefix, info) for prefix, h in _units(root) for info in h.infos}
    expected |= {name for name, _ in _other_states(root)}
    keys = _check_keys(state_dict, expected, strict)
    with torch.no_grad():
        for prefix, handle in _units(root):
            flat = handle.flat_param.new_zeros(handle.numel)
            for info in handle.infos:
                name = _name(prefix, info)
                if name in state_dict:
                    _check_shape(name, state_dict[name], info.shape)
                    flat.narrow(0, info.offset, info.numel).copy_(state_dict[name].reshape(-1))
            handle.load_full_flat(flat)
        for name, t in _other_states(root):
            if name in state_dict:
                _check_shape(name, state_dict[name], t.shape)
                t.copy_(state_dict[name])
    return keys


def _shard_mesh(handle):
    """A 1-d DeviceMesh over the unit's shard group (made once per handle; no communication)."""
    mesh = getattr(handle, "_state_dict_mesh", None)
    if mesh is None:
        from pt_dist.device_mesh import DeviceMesh

        mesh = handle._state_dict_mesh = DeviceMesh.from_group(handle.shard_group, handle.device.type)
    return mesh


def _rows(full: torch.Tensor, mesh, sharded: bool):
    """This rank's ``torch.chunk`` rows of ``full`` as a DTensor (Replicate for a scalar or an unsharded unit)."""
    from pt_dist.tensor import DTensor, Replicate, Shard
    from pt_dist.tensor._utils import compute_local_shape_and_global_offset

    placements = [Shard(0) if sharded and full.dim() > 0 else Replicate()]
    sizes, offsets = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    local = full.narrow(0, offsets[0], sizes[0]) if placements[0].is_shard() else full
    return DTensor.from_local(local.clone(), mesh, placements, run_check=False, shape=full.shape,
                              stride=full.stride())


def sharded_state_dict(root) -> dict:
    """Collective over each unit's shard group (one all-gather per unit)."""
    out = {}
    for prefix, handle in _units(root):
        flat, mesh = handle.full_flat(), _shard_mesh(handle)
        for info in handle.infos:
            full = flat.narrow(0, info.offset, info.numel).view(info.shape)
            out[_name(prefix, info)] = _rows(full, mesh, handle.sharded)
    out.update({name: saved_buffer(root, t) for name, t in _other_states(root)})
    return out


def load_sharded_state_dict(root, state_dict: dict, strict: bool = True):
    """Each DTensor gathered back to the full parameter (collective), then loaded as a full state dict."""
    owner = {_name(prefix, info): handle for prefix, handle in _units(root) for info in handle.infos}
    full = {k: _gathered(v, owner.get(k)) for k, v in state_dict.items()}
    return load_full_state_dict(root, full, strict)


def _gathered(value, handle):
    """A SHARDED_STATE_DICT entry as the whole tensor, gathered over its unit's shard group when the DTensor's
    mesh is that unit's (torch's ``_sharded_pre_load_state_dict_hook`` gathers over the unit's process group): a
    deep-copied or unpickled DTensor's mesh carries no group of its own."""
    if not _is_dtensor(value):
        return value
    if handle is not None and value.device_mesh == _shard_mesh(handle):
        from pt_dist.tensor import DTensor

        value = DTensor.from_local(value.to_local(), _shard_mesh(handle), value.placements, run_check=False,
                                   shape=value.shape, stride=value.stride())
    return value.full_tensor()


def local_state_dict(root) -> dict:
    """Each unit's flat parameter as torch's ``_local_post_state_dict_hook`` gives it: global size the unpadded
    flat parameter, this rank's rows its shard without the padding (``torch.chunk``'s rows, a DTensor)."""
    from pt_dist.tensor import DTensor, Replicate, Shard

    out = {}
    for prefix, handle in _units(root):
        start, n = _local_rows(handle)
        placements = [Shard(0) if handle.sharded else Replicate()]
        out[prefix + FLAT_PARAM] = DTensor.from_local(
            handle.flat_param.detach().narrow(0, 0, n).clone(), _shard_mesh(handle), placements, run_check=False,
            shape=(handle.numel if handle.sharded else handle.shard_numel,), stride=(1,))
    out.update({name: t.detach() for name, t in _other_states(root)})
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
    if _is_dtensor(value):
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
    _check_shape(name, value, handle.flat_param.shape, "(saved by a different number of ranks?)")
    handle.flat_param.copy_(value)


def load_local_state_dict(root, state_dict: dict, strict: bool = True):
    handles = {prefix + FLAT_PARAM: handle for prefix, handle in _units(root)}
    others = dict(_other_states(root))
    keys = _check_keys(state_dict, set(handles) | set(others), strict)
    with torch.no_grad():
        for name, handle in handles.items():
            if name in state_dict:
                _load_local_flat(handle, name, state_dict[name])
        for name, target in others.items():
            if name in state_dict:
                value = state_dict[name].to_local() if _is_dtensor(state_dict[name]) else state_dict[name]
                _check_shape(name, value, target.shape)
                target.copy_(value)
    return keys


def pre_load_state_dict_hook(unit, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
    """``nn.Module.load_state_dict`` of a plain parent reaching a unit (torch's ``_pre_load_state_dict_hook``):
    this unit's own parameters, under the plain names after ``prefix``, are taken out and cut into its shard
    (a DTensor value, SHARDED_STATE_DICT's, gathered first; LOCAL_STATE_DICT's one flat shard copied); what is
    left under ``prefix`` moves under the wrapped module's name, so the walk on loads the buffers, the ignored
    modules' parameters and the nested units' entries where they are."""
    from pt_dist.fsdp.fully_sharded_data_parallel import FSDP_WRAPPED_MODULE, StateDictType

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
                name = _name(prefix, info)
                if name not in state_dict:
                    missing.append(name)
                    continue
                value = _gathered(state_dict.pop(name), handle)
                _check_shape(name, value, info.shape)
                flat.narrow(0, info.offset, info.numel).copy_(value.reshape(-1))
            handle.load_full_flat(flat)
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[f"{prefix}{FSDP_WRAPPED_MODULE}.{key[len(prefix):]}"] = state_dict.pop(key)
    loaded = {f"{prefix}{FSDP_WRAPPED_MODULE}.{FLAT_PARAM}"}
    if handle is not None and handle.orig is not None:  # the originals, registered where the walk goes on
        loaded |= {f"{prefix}{FSDP_WRAPPED_MODULE}.{info.fqn}" for info in handle.infos}
    unit.__dict__["_loading_flat_keys"] = loaded


def post_load_state_dict_hook(unit, incompatible) -> None:
    """The walk's default loading of the wrapped module counted the flat parameter missing (a plain module's
    state dict never holds it), and with ``use_orig_params`` the originals the pre-hook loaded already."""
    keys = unit.__dict__.pop("_loading_flat_keys", set())
    incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in keys]


def _is_dtensor(value) -> bool:
    from pt_dist.tensor import DTensor

    return isinstance(value, DTensor)


def _check_keys(state_dict: dict, expected: set, strict: bool):
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"FullyShardedDataParallel.load_state_dict: missing keys {missing[:8]}, unexpected keys {unexpected[:8]}"
        )
    return _IncompatibleKeys(missing, unexpected)


def _check_shape(name: str, tensor, shape, hint: str = "") -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.shape != shape:
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(
            f"FullyShardedDataParallel.load_state_dict: {name!r} has shape {got}, this model's is "
            f"{tuple(shape)} {hint}".rstrip()
        )
