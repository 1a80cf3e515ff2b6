"""FSDP optimizer state dicts (torch/distributed/fsdp/_optim_utils.py): the optimizer steps each unit's flat
shard, so its per-element state (Adam's ``exp_avg``, ``exp_avg_sq``, SGD's ``momentum_buffer``) is a shard too.

``optim_state_dict`` all-gathers each such state over the unit's shard group and cuts it back into the module's
original parameters, keyed by their names (what torch's ``FSDP.optim_state_dict`` returns under
``FULL_STATE_DICT``: every rank gets all of it, or rank 0 only with ``rank0_only``); ``optim_state_dict_to_load``
is the way back: the full per-name state re-flattened, padded and cut into this rank's shard, in the optimizer's
own ``state_dict`` form (parameter indices), for ``optim.load_state_dict``. Loading needs no communication, so a
full optimizer state dict saved at one world size loads at another. Under ``SHARDED_STATE_DICT`` each
per-element state is instead this rank's ``torch.chunk`` rows of it, a DTensor, as the model's sharded state
dict (torch gives ShardedTensors with the same rows); loading gathers them back (a collective) first.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp import state_dict as _sd
from pt_dist.fsdp.api import StateDictType

FLAT_PARAM = "_flat_param"


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def _pieces(prefix, handle):
    """(name, offset, numel, shape) of each distinct parameter of a unit (a tied one under its first name)."""
    seen, out = set(), []
    for info, piece in zip(handle.infos, handle._piece_of):
        if piece not in seen:
            seen.add(piece)
            out.append((prefix + info.fqn, info.offset, info.numel, info.shape))
    return out


def _layout(model, optim):
    """Per optimizer index: ("flat", prefix, handle) for a unit's flat shard, ("plain", name) otherwise."""
    model._lazy_init()
    by_param = {id(u._handle.flat_param): (prefix, u._handle) for prefix, u in model._named_units()
                if u._handle is not None}
    names = {id(p): _clean(n) for n, p in model.named_parameters()}
    layout = []
    for p in (p for g in optim.param_groups for p in g["params"]):
        if id(p) in by_param:
            layout.append(("flat", *by_param[id(p)]))
        elif id(p) in names:
            layout.append(("plain", names[id(p)]))
        else:
            raise ValueError("FSDP.optim_state_dict: the optimizer holds a parameter that is not the model's")
    return layout


def _is_sharded_state(value, handle) -> bool:
    return torch.is_tensor(value) and value.dim() == 1 and value.numel() == handle.shard_numel


def optim_state_dict(model, optim, optim_state_dict=None, group=None) -> dict:
    """Collective over every unit's shard group: the optimizer's state keyed by the module's parameter names
    (all of it on every rank; on global rank 0 only under ``state_dict_type(..., optim_state_dict_config=
    FullOptimStateDictConfig(rank0_only=True))``)."""
    if group is not None:
        raise ValueError("FSDP.optim_state_dict: group= is not supported; units use their own groups")
    osd = optim.state_dict() if optim_state_dict is None else optim_state_dict
    if getattr(model, "_state_dict_type", None) is StateDictType.SHARDED_STATE_DICT:
        return _gathered(model, optim, osd, keep=True, as_rows=True)
    config = getattr(model, "_optim_state_dict_config", None)
    return _gathered(model, optim, osd, keep=not getattr(config, "rank0_only", False) or c10d.get_rank() == 0)


def full_optim_state_dict(model, optim, optim_input=None, rank0_only: bool = True, group=None) -> dict:
    """torch's older spelling of ``optim_state_dict`` (same name-keyed result; rank 0 only by default)."""
    if optim_input is not None or group is not None:
        raise ValueError("FSDP.full_optim_state_dict: optim_input= and group= are not supported; pass the optimizer")
    return _gathered(model, optim, optim.state_dict(), keep=not rank0_only or c10d.get_rank() == 0)


def shard_full_optim_state_dict(full_optim_state_dict: dict, model, optim_input=None, optim=None) -> dict:
    """torch's older spelling of ``optim_state_dict_to_load``; without ``optim``, for an optimizer built over
    ``model.parameters()`` in one group."""
    if optim_input is not None:
        raise ValueError("FSDP.shard_full_optim_state_dict: optim_input= is not supported; pass optim=")
    optim = optim or SimpleNamespace(param_groups=[{"params": list(model.parameters())}])
    return optim_state_dict_to_load(model, optim, full_optim_state_dict)


def _gathered(model, optim, osd: dict, keep: bool, as_rows: bool = False) -> dict:
    state, names_of = {}, {}
    for idx, entry in enumerate(_layout(model, optim)):
        own = osd["state"].get(idx, {})
        if entry[0] == "plain":
            names_of[idx] = [entry[1]]
            if own:
                state[entry[1]] = {k: v.clone() if torch.is_tensor(v) else v for k, v in own.items()}
            continue
        _, prefix, handle = entry
        pieces = _pieces(prefix, handle)
        names_of[idx] = [name for name, *_ in pieces]
        full = {}
        for k in sorted(own):  # (every rank in the same order: the gathers are collectives)
            v = own[k]
            if _is_sharded_state(v, handle):
                whole = v.new_empty(handle.padded_numel)
                if handle.sharded and handle.shard_group.size() > 1:
                    handle.shard_group.all_gather_into_tensor(whole, v.detach().contiguous()).wait()
                else:
                    whole.copy_(v)
                full[k] = whole
        if keep and own:
            mesh = _sd._shard_mesh(handle) if as_rows else None
            for name, offset, numel, shape in pieces:
                state[name] = {k: (_piece(full[k], offset, numel, shape, mesh, handle) if k in full else
                                   (v.clone() if torch.is_tensor(v) else v)) for k, v in own.items()}
    if not keep:
        return {}
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [n for i in g["params"] for n in names_of[i]]} for g in osd["param_groups"]]
    return {"state": state, "param_groups": groups}


def _piece(whole, offset: int, numel: int, shape, mesh, handle):
    """One parameter's part of a gathered per-element state: whole, or (``mesh``) this rank's rows of it."""
    full = whole.narrow(0, offset, numel).view(shape)
    return full.clone() if mesh is None else _sd._rows(full, mesh, handle.sharded)


def _gathered_rows(state_in: dict) -> dict:
    """A sharded optimizer state dict's DTensor values gathered whole (collective: every rank, the same order)."""
    return {name: {k: (v.full_tensor() if _sd._is_dtensor(v) else v) for k, v in sorted(st.items())}
            for name, st in sorted(state_in.items())}


def optim_state_dict_to_load(model, optim, optim_state_dict: dict, is_named_optimizer: bool = False,
                             load_directly: bool = False, group=None) -> dict:
    """The full, name-keyed optimizer state dict cut into this rank's shards, as ``optim.load_state_dict`` takes
    it (no communication). ``load_directly`` loads it into ``optim`` as well."""
    if is_named_optimizer or group is not None:
        raise ValueError("FSDP.optim_state_dict_to_load: is_named_optimizer and group= are not supported")
    state_in, layout = _gathered_rows(optim_state_dict["state"]), _layout(model, optim)
    state, first_names = {}, []
    for idx, entry in enumerate(layout):
        if entry[0] == "plain":
            first_names.append(entry[1])
            if entry[1] in state_in:
                state[idx] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state_in[entry[1]].items()}
            continue
        _, prefix, handle = entry
        pieces = _pieces(prefix, handle)
        first_names.append(pieces[0][0])
        present = [name for name, *_ in pieces if name in state_in]
        if not present:
            continue
        if len(present) != len(pieces):
            missing = sorted({name for name, *_ in pieces} - set(present))
            raise KeyError(f"FSDP.optim_state_dict_to_load: no state for {missing} (the unit of {present[0]!r})")
        start = (handle.shard_group.rank() if handle.sharded else 0) * handle.shard_numel
        out = {}
        for k, v in state_in[present[0]].items():
            if torch.is_tensor(v) and v.dim() > 0 and v.numel() == pieces[0][2]:  # per element: re-flatten
                flat = v.new_zeros(handle.padded_numel)
                for name, offset, numel, shape in pieces:
                    t = state_in[name][k]
                    if tuple(t.shape) != tuple(shape):
                        raise ValueError(f"FSDP.optim_state_dict_to_load: state {k!r} of {name!r} has shape "
                                         f"{tuple(t.shape)}, the parameter {tuple(shape)}")
                    flat.narrow(0, offset, numel).copy_(t.reshape(-1))
                out[k] = flat.narrow(0, start, handle.shard_numel).clone()
            else:
                out[k] = v.clone() if torch.is_tensor(v) else v
        state[idx] = out
    groups, at = [], 0
    name_to_idx = {n: i for i, n in enumerate(first_names)}
    for g, own in zip(optim_state_dict["param_groups"], optim.param_groups):
        idxs = sorted({name_to_idx[n] for n in g["params"] if n in name_to_idx})
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": idxs or
                       list(range(at, at + len(own["params"])))})
        at += len(own["params"])
    result = {"state": state, "param_groups": groups}
    if load_directly:
        optim.load_state_dict(result)
    return result
