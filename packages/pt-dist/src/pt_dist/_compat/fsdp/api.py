"""The state-dict half of torch's fsdp/api.py (the same names and fields): which state dict
``FSDP.state_dict_type`` selects and its configs, and how an optimizer state dict is keyed. The arguments that
shape the mechanism (``ShardingStrategy``, ``MixedPrecision``, ...) are the core's, pt_dist/fsdp/_common_utils.py;
pt_dist/fsdp/api.py re-exports both."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto


class OptimStateKeyType(Enum):
    """How an optimizer state dict's ``state`` is keyed (``FSDP.rekey_optim_state_dict``)."""

    PARAM_NAME = auto()
    PARAM_ID = auto()


class StateDictType(Enum):
    FULL_STATE_DICT = auto()
    LOCAL_STATE_DICT = auto()
    SHARDED_STATE_DICT = auto()


@dataclass
class StateDictConfig:
    offload_to_cpu: bool = False


@dataclass
class FullStateDictConfig(StateDictConfig):
    """``rank0_only``: only rank 0 gets the gathered tensors (the others an empty dict), as torch's."""

    rank0_only: bool = False


@dataclass
class LocalStateDictConfig(StateDictConfig):
    pass


@dataclass
class ShardedStateDictConfig(StateDictConfig):
    pass


@dataclass
class OptimStateDictConfig:
    offload_to_cpu: bool = True


@dataclass
class FullOptimStateDictConfig(OptimStateDictConfig):
    """``rank0_only``: ``FSDP.optim_state_dict`` returns the gathered state on rank 0 only, as torch's."""

    rank0_only: bool = False


@dataclass
class LocalOptimStateDictConfig(OptimStateDictConfig):
    offload_to_cpu: bool = False


@dataclass
class ShardedOptimStateDictConfig(OptimStateDictConfig):
    pass


@dataclass
class StateDictSettings:
    """What ``FSDP.set_state_dict_type`` returns (the previous settings) and ``get_state_dict_type`` reports."""

    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig


# which config goes with which state-dict type (torch's set_state_dict_type refuses any other pairing)
STATE_DICT_CONFIG_TYPES = {StateDictType.FULL_STATE_DICT: FullStateDictConfig,
                           StateDictType.LOCAL_STATE_DICT: LocalStateDictConfig,
                           StateDictType.SHARDED_STATE_DICT: ShardedStateDictConfig}
OPTIM_STATE_DICT_CONFIG_TYPES = {StateDictType.FULL_STATE_DICT: FullOptimStateDictConfig,
                                 StateDictType.LOCAL_STATE_DICT: LocalOptimStateDictConfig,
                                 StateDictType.SHARDED_STATE_DICT: ShardedOptimStateDictConfig}
