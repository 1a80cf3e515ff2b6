"""The tensor-parallel group (vLLM ``distributed/parallel_state.py`` and ``communication_op.py``).

One ``GroupCoordinator`` holds the group: rank 0 is the driver (the engine's process), ranks 1..N-1 the executor's
workers. Its ``device_group`` (NCCL on CUDA, gloo on CPU) carries activations: the row-parallel all-reduce, the
vocabulary-parallel gathers. Its ``cpu_group`` (gloo) carries the driver's per-step metadata
(``broadcast_tensor_dict``), as vLLM keeps a ``cpu_group`` beside each ``device_group``. ``get_tp_group()`` returns
the current one (vLLM's module-level collectives over it are in ``_compat/distributed.py``); without a group (one
rank) it is a group of one and every collective is the identity.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import gc
import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def _move(obj, device):
    """``obj`` with every tensor inside it (dicts, dataclasses) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        moved = {f.name: _move(getattr(obj, f.name), device) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **moved)
    return obj


@dataclasses.dataclass
class GroupCoordinator:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    device_group: dist.ProcessGroup | None = None
    cpu_group: dist.ProcessGroup | None = None

    def all_reduce(self, x: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(x, op=op, group=self.device_group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """The ranks' pieces concatenated on ``dst``; ``None`` elsewhere (vLLM gathers logits to the driver)."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == dst else None
        dist.gather(x.contiguous(), parts, dst=dst, group=self.device_group)
        return torch.cat(parts, dim=dim) if self.rank == dst else None

    def broadcast_tensor_dict(self, data=None, src: int = 0):
        """The driver's ``data`` (any picklable structure of tensors) on every rank, on each rank's device."""
        if self.world_size == 1:
            return data
        box = [_move(data, "cpu") if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self.cpu_group)
        return box[0] if self.rank == src else _move(box[0], self.device)

    def min_over_ranks(self, values: tuple[int, ...]) -> tuple[int, ...]:
        """Element-wise minimum over the ranks (the KV block counts every rank can hold)."""
        t = torch.tensor(values, dtype=torch.int64)
        if self.world_size > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return tuple(int(v) for v in t)


_TP = GroupCoordinator()


def init_distributed_environment(world_size: int, rank: int, distributed_init_method: str, device: torch.device,
                                 timeout_s: float = 300.0) -> None:  # fmt: skip
    """Join the ``world_size`` ranks (the TP group is the whole world here) and make the TP group current."""
    global _TP
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=distributed_init_method, world_size=world_size, rank=rank,
                            timeout=timeout)  # fmt: skip
    # the metadata group's workers wait for the next step however long the engine stays idle
    cpu_group = dist.new_group(list(range(world_size)), backend="gloo", timeout=datetime.timedelta(days=1))
    _TP = GroupCoordinator(rank, world_size, device, dist.group.WORLD, cpu_group)


@contextlib.contextmanager
def use_tp_group(group: GroupCoordinator):
    """Make ``group`` current while a model is built (its layers keep the group current at construction), so a
    one-rank engine built beside a tensor-parallel one in the same process stays one rank."""
    global _TP
    previous, _TP = _TP, group
    try:
        yield group
    finally:
        _TP = previous


def destroy_model_parallel() -> None:
    """Leave the group (and the process group under it); the process is a group of one again."""
    global _TP
    _TP = GroupCoordinator()
    if dist.is_initialized():
        dist.destroy_process_group()


def get_tp_group() -> GroupCoordinator:
    return _TP


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """vLLM's teardown between two engines in one process (examples call it after ``del llm``): engines nothing
    refers to any more are collected (``LLMEngine.__del__`` -> ``shutdown``: model, KV cache, workers), the group is
    left, and the CUDA caching allocator gives its freed blocks back."""
    gc.collect()  # a deleted LLM caught in a reference cycle: its engine shuts down now
    destroy_model_parallel()
    if shutdown_ray:
        logger.info("cleanup_dist_env_and_memory(shutdown_ray=True): paged_serve runs no Ray; nothing to stop")
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
