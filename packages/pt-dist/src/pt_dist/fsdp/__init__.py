"""Fully sharded data parallelism over pt_dist groups (torch.distributed.fsdp): FSDP1's
``FullyShardedDataParallel`` and FSDP2's ``fully_shard``."""

from pt_dist._compat.fsdp.fsdp_forward_method import register_fsdp_forward_method
from pt_dist.fsdp._fully_shard import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    UnshardHandle,
    fully_shard,
)
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
    "CPUOffloadPolicy",
    "FSDPModule",
    "FullOptimStateDictConfig",
    "FullStateDictConfig",
    "FullyShardedDataParallel",
    "LocalOptimStateDictConfig",
    "LocalStateDictConfig",
    "MixedPrecision",
    "MixedPrecisionPolicy",
    "OffloadPolicy",
    "OptimStateDictConfig",
    "OptimStateKeyType",
    "ModuleWrapPolicy",
    "ShardedOptimStateDictConfig",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictConfig",
    "StateDictSettings",
    "StateDictType",
    "UnshardHandle",
    "always_wrap_policy",
    "fully_shard",
    "lambda_auto_wrap_policy",
    "register_fsdp_forward_method",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]
