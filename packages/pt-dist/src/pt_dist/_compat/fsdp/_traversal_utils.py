"""Walking a model's FSDP units for torch's API around them (torch's fsdp/_traversal_utils.py): the units, the
outermost ones, each unit's distinct parameters by name, and one parameter's part of a gathered flat state (the
leaf the optimizer-state, state-dict-type and summon modules share)."""

from __future__ import annotations

from torch import nn

from pt_dist.fsdp import state_dict as _sd
from pt_dist.fsdp._common_utils import clean_tensor_name
from pt_dist.fsdp._runtime_utils import FullyShardedDataParallel as FSDP


def fsdp_modules(module: nn.Module, root_only: bool = False) -> list:
    """The FSDP units in ``module`` (itself included), in ``modules()`` order; with ``root_only`` the outermost."""
    units = [m for m in module.modules() if isinstance(m, FSDP)]
    if not root_only:
        return units
    inner = {id(m) for u in units for m in u.module.modules() if isinstance(m, FSDP)}
    return [u for u in units if id(u) not in inner]


def named_units(module: nn.Module):
    """``(prefix of the unit's parameters in the plain module's state dict, unit)`` for every unit in ``module``,
    an FSDP unit or a plain module holding units (torch's non-FSDP root)."""
    return FSDP._named_units(module)


def pieces(prefix: str, handle) -> list:
    """(name, offset, numel, shape) of each distinct parameter of a unit (a tied one under its first name)."""
    seen, out = set(), []
    for info, piece in zip(handle.infos, handle._piece_of):
        if piece not in seen:
            seen.add(piece)
            out.append((clean_tensor_name(prefix + info.fqn), info.offset, info.numel, info.shape))
    return out


def piece(whole, offset: int, numel: int, shape, mesh, handle):
    """One parameter's part of a gathered per-element state: whole, or (``mesh``) this rank's rows of it."""
    full = whole.narrow(0, offset, numel).view(shape)
    return full.clone() if mesh is None else _sd._rows(full, mesh, handle.sharded)
