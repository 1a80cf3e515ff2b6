"""Process groups around the engine (DeepSpeed's ``deepspeed/utils/groups.py`` and its ``mpu`` protocol).

An ``mpu`` is Megatron's parallel-state object: ``get_data_parallel_group()`` for the ranks that hold
replicas (ZeRO partitions across them) and ``get_model_parallel_group()`` for the ranks that hold
different parts of one replica (tensor and/or pipeline parallel). Without one, data parallelism is
the whole world and there is no model parallelism.
"""

from __future__ import annotations

import torch.distributed as dist


class ParallelGroups:
    """The data- and model-parallel groups one rank trains in, with ranks relative to each."""

    def __init__(self, mpu=None):
        self.mpu = mpu
        if mpu is None:
            self.dp_group = None
            self.mp_group = None
            self.dp_world_size = dist.get_world_size()
            self.dp_rank = dist.get_rank()
            self.mp_world_size, self.mp_rank, self.slice_rank = 1, 0, 0
            return
        self.dp_group = _call(mpu, "get_data_parallel_group")
        self.mp_group = _call(mpu, "get_model_parallel_group", "get_tensor_model_parallel_group")
        self.dp_world_size = dist.get_world_size(self.dp_group)
        self.dp_rank = dist.get_rank(self.dp_group)
        self.mp_world_size = dist.get_world_size(self.mp_group)
        # The tensor-parallel rank, not the rank in mp_group: a pipeline grid's model-parallel group spans
        # the stages (norms are summed over it) while every stage is tensor-parallel rank 0 (DeepSpeed's grid).
        self.mp_rank = int(_call(mpu, "get_model_parallel_rank", "get_tensor_model_parallel_rank"))
        self.slice_rank = dist.get_rank(self.mp_group)  # which part of the replica: names checkpoint files

    def dp_src(self) -> int:
        """The global rank of data-parallel rank 0: torch's broadcast takes a global ``src``."""
        return global_rank(self.dp_group, 0)


def _call(mpu, *names):
    for name in names:
        if hasattr(mpu, name):
            return getattr(mpu, name)()
    raise TypeError(f"mpu {type(mpu).__name__} has none of {list(names)} (Megatron's parallel-state interface)")


def global_rank(group, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def is_model_parallel_parameter(p) -> bool:
    """Sharded across the model-parallel group (each rank has a different piece), as Megatron marks them."""
    return bool(getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False))


def counts_in_norm(p, mp_rank: int) -> bool:
    """Megatron/DeepSpeed's rule: a replicated param enters the global norm once (on model-parallel rank 0);
    a tied copy a pipeline stage does not own (``ds_pipe_replicated``) not at all."""
    if getattr(p, "ds_pipe_replicated", False):
        return False
    return is_model_parallel_parameter(p) or mp_rank == 0
