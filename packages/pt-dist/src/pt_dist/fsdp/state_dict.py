"""FSDP state dicts (torch's fsdp/_state_dict_utils.py): *full*, every unit's flat parameter gathered and cut back
into the plain module's parameters under their plain names (so ``plain_model.load_state_dict`` takes it); and
*sharded* (``SHARDED_STATE_DICT``), the same names, each parameter a DTensor over its unit's shard group holding
this rank's rows (``Shard(0)``, cut as ``torch.chunk``: torch's ``_ext_chunk_dtensor``), which is what
``pt_dist.checkpoint.save`` saves so it loads at any world size, or into a plain model. (torch's
``state_dict_type`` switch and its *local* form: pt_dist/_compat/fsdp/state_dict_type.py.)"""

from __future__ import annotations

import torch
from torch.nn.modules.module import _IncompatibleKeys

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp._common_utils import clean_tensor_name as _clean


def _other_states(root):
    """Persistent buffers and the parameters FSDP does not flatten (ignored modules'), under the plain module's
    names (non-persistent buffers, such as rotary embeddings' ``inv_freq``, stay out, as in ``nn.Module``'s). State
    dicts hold them detached, not cloned, as torch's (only the gathered parameters are copies)."""
    for prefix, module in root.named_modules():
        for name, b in module._buffers.items():
            if b is not None and name not in module._non_persistent_buffers_set:
                yield _clean(f"{prefix}.{name}" if prefix else name), b
    managed = {id(p) for u in root._units if u._handle is not None for p in u._handle.managed_params()}
    for name, p in root.named_parameters():
        if id(p) not in managed:  # (the units' own are saved through their handles)
            yield _clean(name), p


def saved_buffer(unit, t: torch.Tensor) -> torch.Tensor:
    """A buffer as a state dict holds it: detached, or copied back to the dtype it had before mixed precision's
    cast (``cast_buffers``)."""
    root = unit._root or unit
    entry = getattr(root, "_orig_buffer_dtypes", {}).get(id(t))
    return t.detach().to(entry[1]) if entry is not None and entry[0] is t else t.detach()


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
