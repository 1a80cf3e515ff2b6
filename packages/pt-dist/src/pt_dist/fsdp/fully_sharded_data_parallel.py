"""torch.distributed.fsdp.fully_sharded_data_parallel: ``FullyShardedDataParallel`` (torch's class, the core unit
of pt_dist/fsdp/_runtime_utils.py with torch's API around it: pt_dist/_compat/fsdp/fully_sharded_data_parallel.py)
and the argument types torch's module also holds."""

from pt_dist._compat.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
from pt_dist.fsdp._common_utils import FLAT_PARAM, FSDP_WRAPPED_MODULE
from pt_dist.fsdp.api import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    OptimStateDictConfig,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)

__all__ = [
    "FLAT_PARAM",
    "FSDP_WRAPPED_MODULE",
    "BackwardPrefetch",
    "CPUOffload",
    "FullOptimStateDictConfig",
    "FullStateDictConfig",
    "FullyShardedDataParallel",
    "LocalOptimStateDictConfig",
    "LocalStateDictConfig",
    "MixedPrecision",
    "OptimStateDictConfig",
    "OptimStateKeyType",
    "ShardedOptimStateDictConfig",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictConfig",
    "StateDictSettings",
    "StateDictType",
]
