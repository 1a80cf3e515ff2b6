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
``use_orig_params=True`` units' states are per original parameter (use_orig_params_optim.py).
"""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.fsdp._traversal_utils import fsdp_modules, named_units, piece, pieces
from pt_dist._compat.fsdp.api import OptimStateKeyType, StateDictSettings, StateDictType
from pt_dist._compat.fsdp.state_dict_type import get_state_dict_type
from pt_dist._compat.fsdp.use_orig_params import OrigParamsHandle
from pt_dist._compat.fsdp.use_orig_params_optim import gathered_orig, orig_to_load, orig_units
from pt_dist.fsdp import state_dict as _sd
from pt_dist.fsdp._common_utils import clean_tensor_name as _clean
from pt_dist.object_collectives import all_gather_object, broadcast_object_list


def _layout(model, optim):
    """Per optimizer index: ("flat", prefix, handle) for a unit's flat shard, ("plain", name) otherwise. The model
    is an FSDP unit or a plain module holding units (torch's non-FSDP root)."""
    for root in fsdp_modules(model, root_only=True):
        root._lazy_init()
    units = [(prefix, u._handle) for prefix, u in named_units(model) if u._handle is not None]
    by_param = {id(h.flat_param): (prefix, h) for prefix, h in units}
    originals = {id(p): (prefix, h, i) for prefix, h in units if isinstance(h, OrigParamsHandle)
                 for i, p in enumerate(h.params)}
    names = {id(p): _clean(n) for n, p in model.named_parameters()}
    layout = []
    for p in (p for g in optim.param_groups for p in g["params"]):
        if id(p) in by_param:
            layout.append(("flat", *by_param[id(p)]))
        elif id(p) in originals:  # use_orig_params: ("orig", prefix, handle, which of its parameters)
            layout.append(("orig", *originals[id(p)]))
        elif id(p) in names:
            layout.append(("plain", names[id(p)]))
        else:
            raise ValueError("FSDP.optim_state_dict: the optimizer holds a parameter that is not the model's")
    return layout


def _settings(model):
    return get_state_dict_type(model) or StateDictSettings(StateDictType.FULL_STATE_DICT, None, None)


def _check_group(model, group, what: str) -> None:
    """torch's ``group=`` names the model's process group; units here use their own, so another is an error."""
    if group is None:
        return
    own = {id(u.process_group) for u in fsdp_modules(model)}
    if own != {id(group)}:
        raise ValueError(f"FSDP.{what}: group={group!r} is not the process group the model's units shard over")


def _from_optim_input(model, optim_input, optim, what: str):
    """torch's deprecated ``optim_input`` (the optimizer's params or param groups, in order; None with no
    ``optim`` means ``model.parameters()``), as an object with ``param_groups``."""
    if optim_input is not None:
        warnings.warn("The `optim_input` argument is deprecated and will be removed after PyTorch 1.13. You may "
                      "remove it from your code without changing its functionality.", FutureWarning, stacklevel=3)
    elif optim is not None:
        return optim
    items = list(model.parameters() if optim_input is None else optim_input)
    if not items:
        raise ValueError(f"FSDP.{what}: Optimizer input should not be empty")
    if all(isinstance(g, dict) for g in items):
        return SimpleNamespace(param_groups=[{**g, "params": list(g["params"])} for g in items])
    return SimpleNamespace(param_groups=[{"params": items}])


def _is_sharded_state(value, handle) -> bool:
    return torch.is_tensor(value) and value.dim() == 1 and value.numel() == handle.shard_numel


def optim_state_dict(model, optim, optim_state_dict=None, group=None) -> dict:
    """Collective over every unit's shard group: the optimizer's state keyed by the module's parameter names
    (all of it on every rank; on global rank 0 only under ``state_dict_type(..., optim_state_dict_config=
    FullOptimStateDictConfig(rank0_only=True))``; this rank's rows, DTensors, under ``SHARDED_STATE_DICT``)."""
    _check_group(model, group, "optim_state_dict")
    osd = optim.state_dict() if optim_state_dict is None else optim_state_dict
    settings = _settings(model)
    if settings.state_dict_type is StateDictType.SHARDED_STATE_DICT:
        return _gathered(model, optim, osd, keep=True, as_rows=True)
    if settings.state_dict_type is StateDictType.LOCAL_STATE_DICT:
        raise NotImplementedError("FSDP.optim_state_dict: LOCAL_STATE_DICT is not supported, as in torch")
    rank0_only = getattr(settings.optim_state_dict_config, "rank0_only", False)
    return _gathered(model, optim, osd, keep=not rank0_only or c10d.get_rank() == 0)


def full_optim_state_dict(model, optim, optim_input=None, rank0_only: bool = True, group=None) -> dict:
    """torch's older spelling of ``optim_state_dict`` (the name-keyed whole state; rank 0 only by default)."""
    _check_group(model, group, "full_optim_state_dict")
    layout_of = _from_optim_input(model, optim_input, optim, "full_optim_state_dict")
    return _gathered(model, layout_of, optim.state_dict(), keep=not rank0_only or c10d.get_rank() == 0)


def sharded_optim_state_dict(model, optim, group=None) -> dict:
    """torch's older spelling of ``optim_state_dict`` under ``SHARDED_STATE_DICT``: this rank's rows, DTensors."""
    _check_group(model, group, "sharded_optim_state_dict")
    return _gathered(model, optim, optim.state_dict(), keep=True, as_rows=True)


def shard_full_optim_state_dict(full_optim_state_dict: dict, model, optim_input=None, optim=None) -> dict:
    """torch's older spelling of ``optim_state_dict_to_load``; without ``optim``, for the optimizer ``optim_input``
    describes (default: ``model.parameters()`` in one group)."""
    layout_of = _from_optim_input(model, optim_input, optim, "shard_full_optim_state_dict")
    return optim_state_dict_to_load(model, layout_of, full_optim_state_dict)


def flatten_sharded_optim_state_dict(sharded_optim_state_dict: dict, model, optim) -> dict:
    """``sharded_optim_state_dict``'s way back (collective: the rows are gathered), for ``optim.load_state_dict``."""
    return optim_state_dict_to_load(model, optim, sharded_optim_state_dict)


def scatter_full_optim_state_dict(full_optim_state_dict, model, optim_input=None, optim=None, group=None) -> dict:
    """``shard_full_optim_state_dict`` where only the group's first rank holds the full state (the others pass
    None): it is broadcast over ``group`` (the model's; default the world) first."""
    _check_group(model, group, "scatter_full_optim_state_dict")
    layout_of = _from_optim_input(model, optim_input, optim, "scatter_full_optim_state_dict")
    src = c10d.get_global_rank(group, 0) if group is not None else 0
    if c10d.get_rank() == src and full_optim_state_dict is None:
        raise ValueError("FSDP.scatter_full_optim_state_dict: rank 0 must pass the full optimizer state dict")
    box = [full_optim_state_dict if c10d.get_rank() == src else None]
    broadcast_object_list(box, src=src, group=group)
    return optim_state_dict_to_load(model, layout_of, box[0])


def rekey_optim_state_dict(optim_state_dict: dict, optim_state_key_type, model, optim_input=None,
                           optim=None) -> dict:
    """The same state keyed by parameter names (``PARAM_NAME``) or by the optimizer's indices (``PARAM_ID``), for
    moving a state between an FSDP model and the plain one (``model`` is the plain model)."""
    if optim_state_key_type not in (OptimStateKeyType.PARAM_NAME, OptimStateKeyType.PARAM_ID):
        raise ValueError(f"Expected optim_state_key_type to be PARAM_NAME or PARAM_ID, got {optim_state_key_type}")
    keys = list(optim_state_dict["state"])
    if not (all(type(k) is str for k in keys) or all(type(k) is int for k in keys)):
        raise ValueError(f"Invalid parameter keys: {optim_state_dict['state'].keys()}")
    to_names = optim_state_key_type is OptimStateKeyType.PARAM_NAME
    if keys and (type(keys[0]) is str) == to_names:
        return optim_state_dict
    layout_of = _from_optim_input(model, optim_input, optim, "rekey_optim_state_dict")
    name_of = {}
    for n, p in model.named_parameters():
        name_of.setdefault(id(p), _clean(n))
    id_to_name = [name_of[id(p)] for g in layout_of.param_groups for p in g["params"]]
    rekey = (lambda k: id_to_name[k]) if to_names else {n: i for i, n in enumerate(id_to_name)}.__getitem__
    groups = copy.deepcopy(optim_state_dict["param_groups"])
    for g in groups:
        g["params"] = sorted(rekey(k) for k in g["params"])
    return {"state": {rekey(k): v for k, v in optim_state_dict["state"].items()}, "param_groups": groups}


def _gathered(model, optim, osd: dict, keep: bool, as_rows: bool = False) -> dict:
    """The name-keyed state: each unit's per-element states all-gathered, units in name order (so ranks whose
    optimizers list the parameters differently still issue the same gathers), after checking every rank's
    optimizer holds the units rank 0's does."""
    osd = _by_index(optim, osd)
    layout = _layout(model, optim)
    flat = sorted((pieces(e[1], e[2])[0][0], idx) for idx, e in enumerate(layout) if e[0] == "flat")
    if not orig_units(model):  # (use_orig_params: the ranks' states are merged instead, as torch's)
        _check_same_units(model, [name for name, _ in flat] + [e[1] for e in layout if e[0] == "plain"])
    state, names_of = {}, {}
    gathered_orig(model, layout, osd, keep, as_rows, state, names_of)
    for idx, entry in enumerate(layout):
        if entry[0] == "plain":
            names_of[idx] = [entry[1]]
            own = osd["state"].get(idx, {})
            if own:
                state[entry[1]] = {k: v.clone() if torch.is_tensor(v) else v for k, v in own.items()}
    for _, idx in flat:
        _, prefix, handle = layout[idx]
        own = osd["state"].get(idx, {})
        parts = pieces(prefix, handle)
        names_of[idx] = [name for name, *_ in parts]
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
            for name, offset, numel, shape in parts:
                state[name] = {k: (piece(full[k], offset, numel, shape, mesh, handle) if k in full else
                                   (v.clone() if torch.is_tensor(v) else v)) for k, v in own.items()}
    if not keep:
        return {}
    result = {"state": state}
    if "param_groups" in osd:  # (torch's test_optim_state_without_param_groups passes a state without them)
        result["param_groups"] = [{**{k: v for k, v in g.items() if k != "params"},
                                   "params": [n for i in g["params"] for n in names_of[i]]}
                                  for g in osd["param_groups"]]
    return result


def _by_index(optim, osd: dict) -> dict:
    """A ``_NamedOptimizer``'s state dict (keyed by parameter names; torch's ``_is_named_optimizer``) keyed by
    the optimizer's indices, through its ``ordered_param_keys``."""
    named = [k for k in osd.get("state", {}) if isinstance(k, str)]
    named += [k for g in osd.get("param_groups", []) for k in g["params"] if isinstance(k, str)]
    if not named:
        return osd
    keys = getattr(optim, "ordered_param_keys", None)
    if keys is None:
        raise ValueError(f"FSDP.optim_state_dict: the state is keyed by names ({named[:3]}) but the optimizer "
                         f"has no ordered_param_keys (a torch.distributed.optim._NamedOptimizer)")
    index = {k: i for i, k in enumerate(keys)}
    out = {"state": {index[k]: v for k, v in osd["state"].items()}}
    if "param_groups" in osd:
        out["param_groups"] = [{**g, "params": sorted(index[k] for k in g["params"])} for g in osd["param_groups"]]
    return out


def _check_same_units(model, names: list) -> None:
    """torch's check: every rank's optimizer holds at least the parameters rank 0's holds (else the gathers would
    not match); a RuntimeError on every rank naming what each lacks."""
    roots = fsdp_modules(model, root_only=True)
    group = roots[0].process_group if roots else None
    if group is None or group.size() == 1:
        return
    everyone = [None] * group.size()
    all_gather_object(everyone, names, group=group)
    missing = {r: sorted(set(everyone[0]) - set(mine)) for r, mine in enumerate(everyone)}
    if any(missing.values()):
        raise RuntimeError(
            "FSDP currently requires each rank to have at least the optimizer states needed by rank 0's optimizer "
            f"but some ranks are missing some of those states (missing, by group rank: "
            f"{ {r: m for r, m in missing.items() if m} })"
        )


def _gathered_rows(state_in: dict) -> dict:
    """A sharded optimizer state dict's DTensor values gathered whole (collective: every rank, the same order)."""
    return {name: {k: (v.full_tensor() if _sd._is_dtensor(v) else v) for k, v in sorted(st.items())}
            for name, st in sorted(state_in.items())}


def optim_state_dict_to_load(model, optim, optim_state_dict: dict, is_named_optimizer: bool = False,
                             load_directly: bool = False, group=None) -> dict:
    """The full, name-keyed optimizer state dict cut into this rank's shards, as ``optim.load_state_dict`` takes
    it (no communication). ``load_directly`` loads it into ``optim`` as well."""
    _check_group(model, group, "optim_state_dict_to_load")
    keys = getattr(optim, "ordered_param_keys", None)
    if is_named_optimizer and keys is None:
        raise ValueError("FSDP.optim_state_dict_to_load: is_named_optimizer=True needs a _NamedOptimizer (its "
                         "ordered_param_keys)")
    settings = _settings(model)
    if (settings.state_dict_type is StateDictType.FULL_STATE_DICT
            and getattr(settings.optim_state_dict_config, "rank0_only", False)):  # saved on rank 0 only: from it
        roots = fsdp_modules(model, root_only=True)
        over = group if group is not None else roots[0].process_group if roots else None
        src = c10d.get_global_rank(over, 0) if over is not None else 0
        box = [optim_state_dict if c10d.get_rank() == src else None]
        broadcast_object_list(box, src=src, group=over)
        optim_state_dict = box[0]
    state_in, layout = _gathered_rows(optim_state_dict["state"]), _layout(model, optim)
    state, first_names = {}, []
    for idx, entry in enumerate(layout):
        if entry[0] == "plain":
            first_names.append(entry[1])
            if entry[1] in state_in:
                state[idx] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state_in[entry[1]].items()}
            continue
        if entry[0] == "orig":
            _, prefix, handle, i = entry
            first_names.append(pieces(prefix, handle)[i][0])
            if first_names[-1] in state_in and handle.in_shard(i):  # (none where no element is here)
                state[idx] = orig_to_load(handle, i, first_names[-1], state_in[first_names[-1]])
            continue
        _, prefix, handle = entry
        parts = pieces(prefix, handle)
        first_names.append(parts[0][0])
        present = [name for name, *_ in parts if name in state_in]
        if not present:
            continue
        if len(present) != len(parts):  # torch's message: its unflattening needs every piece's state
            missing = sorted({name for name, *_ in parts} - set(present))
            raise ValueError(f"All unflattened parameters comprising a single flat parameter must have scalar "
                             f"state with the same value and dtype: no state for {missing} (the unit of "
                             f"{present[0]!r})")
        start = (handle.shard_group.rank() if handle.sharded else 0) * handle.shard_numel
        out = {}
        for k, v in state_in[present[0]].items():
            if torch.is_tensor(v) and v.dim() > 0 and v.numel() == parts[0][2]:  # per element: re-flatten
                flat = v.new_zeros(handle.padded_numel)
                for name, offset, numel, shape in parts:
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
    if is_named_optimizer:  # keyed by the names the _NamedOptimizer loads by
        result = {"state": {keys[i]: st for i, st in state.items()},
                  "param_groups": [{**g, "params": sorted(keys[i] for i in g["params"])} for g in groups]}
    if load_directly:
        optim.load_state_dict(result)
    return result
