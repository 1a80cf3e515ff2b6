"""The arguments of ``FullyShardedDataParallel`` (torch/distributed/fsdp/api.py, the same names and fields)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

import torch

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "FullStateDictConfig",
    "LocalStateDictConfig",
    "MixedPrecision",
    "OptimStateKeyType",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictConfig",
    "StateDictSettings",
    "StateDictType",
]


class ShardingStrategy(Enum):
    """FULL_SHARD: parameters, gradients, optimizer state sharded; parameters gathered for each unit's forward and
    backward and freed after each. SHARD_GRAD_OP: parameters kept gathered from forward to the end of backward.
    NO_SHARD: replicated, gradients all-reduced (DDP). HYBRID_SHARD: FULL_SHARD inside a shard group (a node),
    replicated across the groups."""

    FULL_SHARD = auto()
    SHARD_GRAD_OP = auto()
    NO_SHARD = auto()
    HYBRID_SHARD = auto()


class BackwardPrefetch(Enum):
    """When backward starts the previous unit's all-gather: before this unit's gradient computation (BACKWARD_PRE,
    ahead of this unit's reduce-scatter on the group's queue) or after it (BACKWARD_POST, behind it)."""

    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


@dataclass
class MixedPrecision:
    """Compute in ``param_dtype`` (the all-gathered parameters), reduce gradients in ``reduce_dtype`` (default:
    ``param_dtype``), keep buffers in ``buffer_dtype``; the sharded parameters and the optimizer stay in their own
    dtype (fp32)."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    buffer_dtype: torch.dtype | None = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True


@dataclass
class CPUOffload:
    offload_params: bool = False


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
