"""What ``FullyShardedDataParallel.__init__`` settles before touching a parameter (torch's fsdp/_init_utils.py):
the argument types it checks, and the process groups: one shard group, or for HYBRID_SHARD a shard group within a
node and a replicate group across nodes."""

from __future__ import annotations

import os

from pt_dist import distributed_c10d as c10d
from pt_dist.fsdp._common_utils import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from pt_dist.subgroups import new_group


def _init_process_groups(process_group, strategy):
    """(shard group, replicate group or None): HYBRID_SHARD takes a pair, or cuts the world by node
    (``LOCAL_WORLD_SIZE``, torchrun's)."""
    if strategy in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
        if isinstance(process_group, tuple) and len(process_group) == 2:
            return process_group
        if process_group is not None:
            raise ValueError(
                f"FullyShardedDataParallel: HYBRID_SHARD takes process_group=(shard_group, "
                f"replicate_group) or None, got {process_group!r}"
            )
        world, rank = c10d.get_world_size(), c10d.get_rank()
        node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if world % node:
            raise ValueError(
                f"FullyShardedDataParallel: HYBRID_SHARD needs the world ({world}) to be whole nodes of "
                f"LOCAL_WORLD_SIZE={node} ranks"
            )
        shard = replicate = None
        for start in range(0, world, node):  # every rank creates every group, in the same order
            g = new_group(list(range(start, start + node)))
            shard = g if start <= rank < start + node else shard
        for offset in range(node):
            g = new_group(list(range(offset, world, node)))
            replicate = g if rank % node == offset else replicate
        return shard, replicate
    if isinstance(process_group, tuple):
        raise ValueError(
            f"FullyShardedDataParallel: a (shard, replicate) pair of groups is for HYBRID_SHARD, not {strategy.name}"
        )
    if process_group is None and not c10d.is_initialized():
        raise ValueError(
            "FullyShardedDataParallel: the default process group has not been initialized; call "
            "pt_dist.init_process_group first or pass process_group"
        )
    return process_group or c10d.group.WORLD, None


def _check_arguments(sharding_strategy, backward_prefetch, mixed_precision, cpu_offload) -> None:
    if sharding_strategy is not None and not isinstance(sharding_strategy, ShardingStrategy):
        raise TypeError(
            f"FullyShardedDataParallel: sharding_strategy must be a ShardingStrategy, got {sharding_strategy!r}"
        )
    if backward_prefetch is not None and not isinstance(backward_prefetch, BackwardPrefetch):
        raise TypeError(
            f"FullyShardedDataParallel: backward_prefetch must be a BackwardPrefetch or None, got {backward_prefetch!r}"
        )
    if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(f"FullyShardedDataParallel: mixed_precision must be a MixedPrecision, got {mixed_precision!r}")
    if mixed_precision is not None and mixed_precision.keep_low_precision_grads:
        raise ValueError("FullyShardedDataParallel: keep_low_precision_grads is not supported")
    if cpu_offload is not None and not isinstance(cpu_offload, CPUOffload):
        raise TypeError(f"FullyShardedDataParallel: cpu_offload must be a CPUOffload or None, got {cpu_offload!r}")


def _check_offload(module, cpu_offload) -> None:
    """``CPUOffload(offload_params=True)`` keeps the shards and their gradients on the CPU: where the parameters
    already are here (computing on the CPU), so nothing moves; parameters on an accelerator are refused."""
    if cpu_offload is None or not cpu_offload.offload_params:
        return
    devices = sorted({p.device.type for p in module.parameters()} - {"cpu"})
    if devices:
        raise ValueError(
            f"FullyShardedDataParallel: cpu_offload=CPUOffload(offload_params=True) is supported with the "
            f"parameters on the CPU only, found them on {devices}"
        )
