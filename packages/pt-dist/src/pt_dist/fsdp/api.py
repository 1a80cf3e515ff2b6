"""torch.distributed.fsdp.api: the arguments of ``FullyShardedDataParallel`` (the same names and fields). Those
that shape the mechanism live in the core, pt_dist/fsdp/_common_utils.py; the state-dict types and configs of
torch's ``state_dict_type`` in pt_dist/_compat/fsdp/api.py."""

from pt_dist._compat.fsdp.api import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    OptimStateDictConfig,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from pt_dist.fsdp._common_utils import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "FullOptimStateDictConfig",
    "FullStateDictConfig",
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
