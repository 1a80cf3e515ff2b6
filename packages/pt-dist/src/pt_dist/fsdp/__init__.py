"""Fully sharded data parallelism over pt_dist groups (torch.distributed.fsdp)."""

from pt_dist.fsdp.api import (
    BackwardPrefetch,
    CPUOffload,
    FullStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictType,
)
from pt_dist.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
from pt_dist.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "FullStateDictConfig",
    "FullyShardedDataParallel",
    "LocalStateDictConfig",
    "MixedPrecision",
    "ModuleWrapPolicy",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictConfig",
    "StateDictType",
    "always_wrap_policy",
    "lambda_auto_wrap_policy",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
