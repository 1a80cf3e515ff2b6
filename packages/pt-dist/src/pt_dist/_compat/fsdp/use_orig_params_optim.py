"""FSDP optimizer state dicts for ``use_orig_params=True`` units (torch's _optim_utils.py, its ``use_orig_params``
paths): the optimizer steps the original parameters, so each per-element state (Adam's ``exp_avg``) is the run of
a parameter that falls in this rank's flat shard, or nothing where none does. Saving puts one unit's runs back
together as its flat shard (zeros between), gathers that once per state and cuts it per parameter, as for a flat
parameter; loading cuts each parameter's full state to this rank's run. The ranks' states are merged (a rank
whose shard holds none of a parameter has no state for it; what it lacks comes from the others), as torch's
``merge_keys``.
"""

from __future__ import annotations

import torch

from pt_dist._compat.fsdp._traversal_utils import named_units, piece, pieces
from pt_dist._compat.fsdp.use_orig_params import OrigParamsHandle
from pt_dist.fsdp import state_dict as _sd
from pt_dist.object_collectives import all_gather_object


def orig_units(model) -> list:
    """``(prefix, handle)`` of every ``use_orig_params`` unit in ``model``, in name order (alike on every rank)."""
    units = [(p, u._handle) for p, u in named_units(model) if isinstance(u._handle, OrigParamsHandle)]
    return sorted(units, key=lambda u: pieces(*u)[0][0])


def gathered_orig(model, layout, osd, keep: bool, as_rows: bool, state: dict, names_of: dict) -> None:
    """use_orig_params: the states of one unit's originals, each a run of its flat shard, put together as the
    shard's (zeros elsewhere), gathered once per state, cut back per parameter; every unit of the model in name
    order on every rank, whether this rank's optimizer holds its parameters or not (torch's merged keys)."""
    members_of = {}
    for idx, e in enumerate(layout):
        if e[0] == "orig":
            members_of.setdefault(id(e[2]), {})[e[3]] = idx
    for prefix, handle in orig_units(model):
        members = members_of.get(id(handle), {})
        parts = pieces(prefix, handle)
        own = {i: osd["state"].get(idx, {}) for i, idx in members.items()}
        per_element = {k: v.dtype for i, st in own.items() for k, v in st.items() if _is_orig_state(v, handle, i)}
        scalars = {i: {k: v for k, v in st.items() if not _is_orig_state(v, handle, i)} for i, st in own.items()
                   if st}
        if handle.sharded and handle.shard_group.size() > 1:  # a rank whose shard holds none of a parameter has
            everyone = [None] * handle.shard_group.size()  # no state for it (no gradient there, as torch's)
            all_gather_object(everyone, (per_element, scalars), group=handle.shard_group)
            per_element = {k: v for each, _ in everyone for k, v in each.items()}
            scalars = {i: st for _, each in reversed(everyone) for i, st in each.items()}  # (the first rank's)
        full = {}
        for k in sorted(per_element):  # (every rank in the same order: the gathers are collectives)
            shard = torch.zeros(handle.shard_numel, dtype=per_element[k], device=handle.device)
            for i, st in own.items():
                if _is_orig_state(st.get(k), handle, i):
                    lo, n = handle.runs[i] if handle.sharded else (handle._offsets[i], handle.shapes[i].numel())
                    shard.narrow(0, lo, n).copy_(st[k].reshape(-1))
            whole = shard.new_empty(handle.padded_numel)
            if handle.sharded and handle.shard_group.size() > 1:
                handle.shard_group.all_gather_into_tensor(whole, shard).wait()
            else:
                whole.copy_(shard)
            full[k] = whole
        mesh = _sd._shard_mesh(handle) if as_rows else None
        for i, idx in members.items():
            name, offset, numel, shape = parts[i]
            names_of[idx] = [name]
            if keep and i in scalars:
                state[name] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in scalars[i].items()}
                state[name].update({k: piece(full[k], offset, numel, shape, mesh, handle) for k in full})


def _is_orig_state(v, handle, i: int) -> bool:
    """A per-element state of the ``i``-th original: shaped as its sharded data (not Adam's scalar ``step``)."""
    return torch.is_tensor(v) and v.dim() > 0 and v.shape == handle.params[i].shape


def orig_to_load(handle, i: int, name: str, st: dict) -> dict:
    """One original's full state cut to the run of it this rank's shard holds (NO_SHARD: all of it)."""
    out = {}
    for k, v in st.items():
        if torch.is_tensor(v) and v.dim() > 0 and v.numel() == handle.shapes[i].numel():
            if tuple(v.shape) != tuple(handle.shapes[i]):
                raise ValueError(f"FSDP.optim_state_dict_to_load: state {k!r} of {name!r} has shape "
                                 f"{tuple(v.shape)}, the parameter {tuple(handle.shapes[i])}")
            if handle.sharded:
                lo, n = handle.runs[i]
                start = handle.shard_group.rank() * handle.shard_numel + lo - handle._offsets[i]
                out[k] = v.reshape(-1).narrow(0, min(max(start, 0), v.numel()), n).clone()
            else:
                out[k] = v.clone()
        else:
            out[k] = v.clone() if torch.is_tensor(v) else v
    return out
