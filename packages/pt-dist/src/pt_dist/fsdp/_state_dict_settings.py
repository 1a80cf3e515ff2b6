"""Which state dict a unit's ``state_dict()`` returns (torch's ``FullyShardedDataParallel.set_state_dict_type``,
``get_state_dict_type``, ``state_dict_type``, ``fsdp_modules``): every unit under the module carries the same
type and configs."""

from __future__ import annotations

import contextlib

from torch import nn

from pt_dist.fsdp.api import (
    OPTIM_STATE_DICT_CONFIG_TYPES,
    STATE_DICT_CONFIG_TYPES,
    StateDictSettings,
    StateDictType,
)


def fsdp_modules(module: nn.Module, root_only: bool = False) -> list:
    """The FSDP units in ``module`` (itself included), in ``modules()`` order; with ``root_only`` the outermost."""
    from pt_dist.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel as FSDP

    units = [m for m in module.modules() if isinstance(m, FSDP)]
    if not root_only:
        return units
    inner = {id(m) for u in units for m in u.module.modules() if isinstance(m, FSDP)}
    return [u for u in units if id(u) not in inner]


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
