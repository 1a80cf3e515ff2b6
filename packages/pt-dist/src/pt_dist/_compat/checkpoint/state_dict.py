"""State dicts any parallelism can save and load (torch/distributed/checkpoint/state_dict.py).

``get_model_state_dict`` keys a model's state by the plain module's names whatever wraps it: DDP's ``module.``
dropped, FSDP1 (``FullyShardedDataParallel``) through its ``state_dict_type`` (``SHARDED_STATE_DICT``: one
DTensor per parameter; ``FULL_STATE_DICT`` with ``full_state_dict``), ``fully_shard`` and tensor-parallel models
as their DTensor parameters are. ``get_optimizer_state_dict`` keys the optimizer's state by those names instead
of parameter indices (FSDP1's through ``FSDP.optim_state_dict``). The ``set_*`` functions take such dicts back:
sharded ones (what ``pt_dist.checkpoint.load`` filled) as they are, full ones cut into this rank's blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.checkpoint.state_dict_utils import (
    _broadcast_state_dict,
    _distribute_state_dict,
    _gather_state_dict,
    _offload_state_dict_to_cpu,
)
from pt_dist.checkpoint._nested_dict import flatten_state_dict, set_element
from pt_dist.object_collectives import broadcast_object_list
from pt_dist.tensor import DTensor

__all__ = [
    "StateDictOptions",
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "get_state_dict",
    "set_model_state_dict",
    "set_optimizer_state_dict",
    "set_state_dict",
]

# torch's type aliases of the module
FQNS_T = set[str]
PrimitiveType = DTensor | torch.Tensor | int | float | str
ValueType = PrimitiveType | list[PrimitiveType] | tuple[PrimitiveType] | dict[str, "ValueType"]
DictValueType = dict[str, ValueType]
ListDictValueType = list[DictValueType]
OptimizerStateType = dict[str, DictValueType | ListDictValueType]

_FLAT_PARAM = "_flat_param"
_FSDP_WRAPPED = "_fsdp_wrapped_module"
_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."
_STATE, _PG, _PARAMS = "state", "param_groups", "params"


@dataclass
class StateDictOptions:
    """``full_state_dict``: gather DTensors into full tensors (and take full ones on set); ``cpu_offload``: move
    to the CPU (with ``full_state_dict``, rank 0 alone keeps the result); ``ignore_frozen_params``: leave out
    parameters that do not require grad; ``strict``: ``load_state_dict``'s; ``broadcast_from_rank0``: on set,
    rank 0 holds the full dict and sends it; ``flatten_optimizer_state_dict``: ``state.<fqn>.<key>`` keys."""

    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


def _fsdp1():
    from pt_dist.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel


def _is_ddp(module) -> bool:
    from pt_dist.nn.parallel.distributed import DistributedDataParallel

    return isinstance(module, (DistributedDataParallel, torch.nn.parallel.DistributedDataParallel))


def _get_fqns(model: nn.Module, name: str, skip_ddp_prefix: bool = True, skip_compiler_prefix: bool = True
              ) -> set[str]:
    """The plain module's name(s) of a parameter or buffer named ``name`` in ``model`` (a flat parameter: all of
    the parameters it holds)."""
    parts, out, obj = name.replace(_CHECKPOINT_PREFIX, "").split("."), [], model
    for i, part in enumerate(parts):
        if _is_ddp(obj):
            if part != "module":
                raise AssertionError(f"Expected 'module', got '{part}'")
            obj = obj.module
            if not skip_ddp_prefix:
                out.append(part)
        elif isinstance(obj, _fsdp1()):
            if i + 1 < len(parts) and parts[i + 1] == _FLAT_PARAM:
                prefix = ".".join(out) + "." if out else ""
                return {prefix + info.fqn for info in obj._handle.infos}
            obj = getattr(obj, _FSDP_WRAPPED)
            if part != _FSDP_WRAPPED:
                out.append(part)
                obj = getattr(obj, part)
        elif part == "_orig_mod" and isinstance(obj, torch._dynamo.eval_frame.OptimizedModule):
            obj = obj._orig_mod
            if not skip_compiler_prefix:
                out.append(part)
        else:
            out.append(part)
            if part != nn.modules.module._EXTRA_STATE_KEY_SUFFIX:
                obj = getattr(obj, part)
    return {".".join(out)}


def _fqn(model: nn.Module, name: str) -> str:
    fqns = _get_fqns(model, name)
    if len(fqns) != 1:
        raise AssertionError(f"Expected 1 FQN for key '{name}', got {len(fqns)}: {fqns}")
    return next(iter(fqns))


def _fsdp_context(model: nn.Module, options: StateDictOptions):
    """FSDP1's ``state_dict_type`` for these options, or nothing for a model without FSDP1 units."""
    fsdp = _fsdp1()
    if not any(isinstance(m, fsdp) for m in model.modules()):
        return contextlib.nullcontext()
    from pt_dist.fsdp import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        ShardedOptimStateDictConfig,
        ShardedStateDictConfig,
        StateDictType,
    )

    if options.full_state_dict:
        rank0 = options.cpu_offload
        return fsdp.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                    FullStateDictConfig(offload_to_cpu=options.cpu_offload, rank0_only=rank0),
                                    FullOptimStateDictConfig(offload_to_cpu=options.cpu_offload,
                                                             rank0_only=rank0 or options.broadcast_from_rank0))
    return fsdp.state_dict_type(model, StateDictType.SHARDED_STATE_DICT,
                                ShardedStateDictConfig(offload_to_cpu=options.cpu_offload),
                                ShardedOptimStateDictConfig(offload_to_cpu=options.cpu_offload))


def _has_fsdp1(model: nn.Module) -> bool:
    return any(isinstance(m, _fsdp1()) for m in model.modules())


def _verify(options: StateDictOptions | None) -> StateDictOptions:
    options = options or StateDictOptions()
    if not isinstance(options, StateDictOptions):
        raise TypeError(f"options must be a StateDictOptions, got {type(options).__name__}")
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError("full_state_dict must be True when broadcast_from_rank0 is True.")
    return options


def _finish(state_dict: dict, options: StateDictOptions) -> dict:
    if options.full_state_dict:
        ranks = (0,) if options.cpu_offload and c10d.is_initialized() else ()
        return _gather_state_dict(state_dict, cpu_offload=options.cpu_offload, ranks_only=ranks)
    return _offload_state_dict_to_cpu(state_dict) if options.cpu_offload else state_dict


def _submodule_filter(model: nn.Module, state_dict: dict, submodules, options: StateDictOptions) -> dict:
    prefixes = [_fqn(model, name) + "." for name, m in model.named_modules() if m in set(submodules)]
    out = {}
    for fqn, value in state_dict.items():
        for prefix in prefixes:
            if fqn.startswith(prefix):
                out[fqn if options.keep_submodule_prefixes else fqn[len(prefix):]] = value
    return out


@torch.no_grad()
def get_model_state_dict(model: nn.Module, *, submodules: set[nn.Module] | None = None,
                         options: StateDictOptions | None = None) -> dict[str, Any]:
    """Collective for FSDP1 and with ``full_state_dict`` (the gathers); the model's state keyed by FQN."""
    options = _verify(options)
    with _fsdp_context(model, options):
        raw = model.state_dict()
    state_dict = {}
    for key, value in raw.items():
        state_dict[key if _has_fsdp1(model) else _fqn(model, key)] = value
    if submodules:
        state_dict = _submodule_filter(model, state_dict, submodules, options)
    if options.ignore_frozen_params:
        for name, p in model.named_parameters():
            if not p.requires_grad:
                for fqn in _get_fqns(model, name):
                    state_dict.pop(fqn, None)
    return _finish(state_dict, options)


def _init_optim_state(optim: torch.optim.Optimizer) -> None:
    """Give an optimizer that never stepped its state (a step with zero gradients at lr 0, as torch's), so its
    state dict has every entry a checkpoint will fill."""
    if optim.state or any(p.grad is not None for g in optim.param_groups for p in g[_PARAMS]):
        return
    for g in optim.param_groups:
        for p in g[_PARAMS]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    lrs = []
    for g in optim.param_groups:
        if "lr" in g:
            lrs.append(g["lr"])
            g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
    optim.step(closure=None)
    for g in optim.param_groups:
        if "lr" in g:
            g["lr"] = lrs.pop(0)
    optim.zero_grad(set_to_none=True)


def _optimizers(optimizers) -> tuple[torch.optim.Optimizer, ...]:
    optims = (optimizers,) if isinstance(optimizers, torch.optim.Optimizer) else tuple(optimizers)
    bad = [type(o).__name__ for o in optims if not isinstance(o, torch.optim.Optimizer)]
    if bad:
        raise TypeError(f"optimizers must be torch.optim.Optimizer(s), got {bad}")
    return optims


def _param_fqns(model: nn.Module) -> dict:
    """{id(parameter): its FQN} (a shared parameter: its first name, as ``named_parameters`` gives it)."""
    return {id(p): _fqn(model, name) for name, p in model.named_parameters()}


def _fqn_keyed(model: nn.Module, optim: torch.optim.Optimizer) -> dict:
    osd = optim.state_dict()
    names = _param_fqns(model)
    params = [p for g in optim.param_groups for p in g[_PARAMS]]
    unknown = [i for i, p in enumerate(params) if id(p) not in names]
    if unknown:
        raise ValueError(f"the optimizer holds parameters (indices {unknown[:8]}) that are not the model's")
    by_index = {i: names[id(p)] for i, p in enumerate(params)}
    return {_STATE: {by_index[i]: v for i, v in osd[_STATE].items()},
            _PG: [{**g, _PARAMS: [by_index[i] for i in g[_PARAMS]]} for g in osd[_PG]]}


@torch.no_grad()
def get_optimizer_state_dict(model: nn.Module, optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
                             *, submodules: set[nn.Module] | None = None,
                             options: StateDictOptions | None = None) -> dict[str, Any]:
    """The optimizers' state keyed by parameter FQN: ``{"state": {fqn: {...}}, "param_groups": [{..., "params":
    [fqn, ...]}]}`` (several optimizers merged)."""
    options = _verify(options)
    if submodules:
        raise ValueError("get_optimizer_state_dict: submodules= is deprecated in torch and not supported here")
    out: dict = {_STATE: {}, _PG: []}
    for optim in _optimizers(optimizers):
        _init_optim_state(optim)
        if _has_fsdp1(model):
            with _fsdp_context(model, options):
                osd = _fsdp1().optim_state_dict(model, optim)
            if not osd:
                continue
        else:
            osd = _fqn_keyed(model, optim)
        out[_STATE].update(osd[_STATE])
        out[_PG].extend(osd[_PG])
    if options.flatten_optimizer_state_dict:
        out = _flatten_optim_state_dict(out)
    return _finish(out, options)


def get_state_dict(model: nn.Module, optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer], *,
                   submodules: set[nn.Module] | None = None,
                   options: StateDictOptions | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    return (get_model_state_dict(model, submodules=submodules, options=options),
            get_optimizer_state_dict(model, optimizers, submodules=submodules, options=options))


def _flatten_optim_state_dict(osd: dict) -> dict:
    """torch's flat optimizer form: ``state.<fqn>.<key>`` and ``param_groups.<fqn>.<key>`` (hyper-parameters per
    parameter, so a checkpoint of some of the parameters still names each one's group settings)."""
    flat = {f"{_STATE}.{fqn}.{k}": v for fqn, state in osd[_STATE].items() for k, v in state.items()}
    for group in osd[_PG]:
        for fqn in group[_PARAMS]:
            flat.update({f"{_PG}.{fqn}.{k}": v for k, v in group.items() if k != _PARAMS})
    return flat


def _unflatten_optim_state_dict(model: nn.Module, optim: torch.optim.Optimizer, flat: dict) -> dict:
    names = _param_fqns(model)
    state, groups = {}, []
    for group in optim.param_groups:
        fqns = [names[id(p)] for p in group[_PARAMS]]
        for fqn in fqns:
            prefix = f"{_STATE}.{fqn}."
            own = {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
            if own:
                state[fqn] = own
        first = f"{_PG}.{fqns[0]}." if fqns else None
        groups.append({**{k[len(first):]: v for k, v in flat.items() if first and k.startswith(first)},
                       _PARAMS: fqns})
    return {_STATE: state, _PG: groups}


def _split_for(model: nn.Module, optim: torch.optim.Optimizer, osd: dict, strict: bool) -> dict:
    """The part of an FQN-keyed optimizer state dict that ``optim`` holds, in ``optim``'s group order (the FQNs
    stand in for parameter ids: ``Optimizer.load_state_dict`` matches them by position)."""
    names = _param_fqns(model)
    state, groups = {}, []
    for group in optim.param_groups:
        fqns = [names[id(p)] for p in group[_PARAMS]]
        for fqn, p in zip(fqns, group[_PARAMS]):
            if fqn in osd[_STATE]:
                state[fqn] = osd[_STATE][fqn]
            elif p.requires_grad and strict:
                raise RuntimeError(f"Missing optimizer state for parameter '{fqn}' in checkpoint. The parameter "
                                   f"requires gradients but has no saved optimizer state. To load anyway, use "
                                   f"StateDictOptions(strict=False).")
        saved = next((g for g in osd[_PG] if set(fqns) & set(g[_PARAMS])), None)
        if saved is None and fqns:
            raise RuntimeError(f"no param group in the optimizer state dict holds {fqns[:4]}")
        hyper = {k: v for k, v in (saved or {}).items() if k != _PARAMS}
        groups.append({**{k: v for k, v in group.items() if k != _PARAMS}, **hyper, _PARAMS: fqns})
    return {_STATE: state, _PG: groups}


def unflatten_state_dict(state_dict: dict[str, Any], mapping: dict) -> dict:
    """The nested state dict back from a flattened one (torch's ``_nested_dict.unflatten_state_dict``)."""
    nested: dict = {}
    for key, value in state_dict.items():
        set_element(nested, mapping[key], value)
    return nested


def _full_to_local(full: dict, local: dict, options: StateDictOptions) -> dict:
    """A full state dict (on rank 0 only, with ``broadcast_from_rank0``) cut to the shapes ``local`` holds."""
    flat_full, _ = flatten_state_dict(full)
    flat_local, mapping = flatten_state_dict(local)
    if options.broadcast_from_rank0:
        _broadcast_state_dict(flat_full, flat_local, strict=options.strict)
        flat_local = {k: v for k, v in flat_local.items() if k in mapping}  # (what this optimizer holds)
    else:
        _distribute_state_dict(flat_full, flat_local)
        flat_local.update({k: v for k, v in flat_full.items() if k not in flat_local})
        mapping.update({k: p for k, p in flatten_state_dict(full)[1].items() if k not in mapping})
    return unflatten_state_dict(flat_local, mapping)


@torch.no_grad()
def set_model_state_dict(model: nn.Module, model_state_dict: dict[str, Any], *,
                         options: StateDictOptions | None = None) -> _IncompatibleKeys:
    """Load an FQN-keyed model state dict (sharded, or full with ``full_state_dict``); returns the missing and
    unexpected keys as ``load_state_dict`` does."""
    options = _verify(options)
    if not model_state_dict and not options.broadcast_from_rank0:
        return _IncompatibleKeys([], [])
    if _has_fsdp1(model):
        if options.broadcast_from_rank0:  # FSDP1 takes a full state dict on every rank: send rank 0's
            box = [model_state_dict if c10d.get_rank() == 0 else None]
            broadcast_object_list(box, src=0)
            model_state_dict = box[0]
        with _fsdp_context(model, dataclasses.replace(options, cpu_offload=False)):
            return model.load_state_dict(model_state_dict, strict=options.strict)
    own = {_fqn(model, k): k for k in model.state_dict()}  # FQN -> the model's own key (with DDP's prefix)
    state_dict = {own.get(k, k): v for k, v in model_state_dict.items()}
    assign = False
    if options.full_state_dict:
        local = model.state_dict()
        # a model built on the meta device gets its values on the device its other tensors are on (else the CPU),
        # assigned rather than copied (torch's)
        devices = {v.device for v in local.values() if isinstance(v, torch.Tensor) and v.dim() > 0}
        assign = torch.device("meta") in devices
        devices.discard(torch.device("meta"))
        if len(devices) > 1:
            raise ValueError(f"set_model_state_dict: the model's tensors are on several devices "
                             f"{sorted(map(str, devices))}")
        device = devices.pop() if devices else torch.device("cpu")
        full = dict(state_dict) if not options.broadcast_from_rank0 or _rank() == 0 else {}
        if options.broadcast_from_rank0:
            _broadcast_state_dict(full, local, device=device, strict=options.strict)
        else:
            _distribute_state_dict(full, local, device=device)
            local.update({k: v for k, v in full.items() if k not in local})
        state_dict = local
    return model.load_state_dict(state_dict, strict=options.strict, assign=assign)


def _rank() -> int:
    return c10d.get_rank() if c10d.is_initialized() else 0


@torch.no_grad()
def set_optimizer_state_dict(model: nn.Module, optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
                             optim_state_dict: dict[str, Any], *, options: StateDictOptions | None = None) -> None:
    """Load an FQN-keyed optimizer state dict into each optimizer (the part of it that optimizer holds)."""
    options = _verify(options)
    for optim in _optimizers(optimizers):
        _init_optim_state(optim)
        osd = optim_state_dict
        if _has_fsdp1(model):
            if options.broadcast_from_rank0:
                box = [osd if c10d.get_rank() == 0 else None]
                broadcast_object_list(box, src=0)
                osd = box[0]
            if _STATE not in osd:
                raise ValueError("set_optimizer_state_dict: a flattened optimizer state dict is not supported "
                                 "with FSDP1 (pass flatten_optimizer_state_dict=False when saving)")
            with _fsdp_context(model, dataclasses.replace(options, cpu_offload=False)):
                optim.load_state_dict(_fsdp1().optim_state_dict_to_load(model, optim, osd))
            continue
        if options.broadcast_from_rank0 or options.full_state_dict:
            local = _fqn_keyed(model, optim)
            full = osd if not options.broadcast_from_rank0 or _rank() == 0 else {}
            if full and _STATE not in full:
                full = _unflatten_optim_state_dict(model, optim, full)
            if full:
                full = _split_for(model, optim, full, options.strict)
            osd = _full_to_local(full, local, options)
        elif _STATE not in osd:
            osd = _unflatten_optim_state_dict(model, optim, osd)
        optim.load_state_dict(_split_for(model, optim, osd, options.strict))


def set_state_dict(model: nn.Module, optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer], *,
                   model_state_dict: dict[str, Any], optim_state_dict: dict[str, Any],
                   options: StateDictOptions | None = None) -> _IncompatibleKeys:
    keys = set_model_state_dict(model, model_state_dict, options=options)
    set_optimizer_state_dict(model, optimizers, optim_state_dict, options=options)
    return keys
