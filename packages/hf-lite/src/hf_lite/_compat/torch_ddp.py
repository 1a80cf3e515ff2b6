"""torch.distributed as transformers' Trainer runs it under torchrun (through accelerate): the default process group
initialised from torchrun's environment, and torch's ``DistributedDataParallel`` behind the core's
``DataParallelPlugin`` (``trainer_distributed.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from ..trainer_distributed import DataParallelPlugin

logger = logging.getLogger(__name__)


def init_distributed(args) -> bool:
    """Initialise the default process group when launched by torchrun (``WORLD_SIZE`` > 1) and none is up yet:
    nccl on CUDA, gloo on CPU, unless ``args.ddp_backend`` says otherwise. True when this call created it (then
    ``Trainer.end()`` takes it down)."""
    if not dist.is_available() or dist.is_initialized():
        return False
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    device = args.device
    backend = args.ddp_backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # env:// reads MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE, which torchrun sets (also across nodes).
    dist.init_process_group(backend, timeout=timedelta(seconds=args.ddp_timeout))
    logger.info("Initialised torch.distributed (%s): rank %d of %d", backend, dist.get_rank(), dist.get_world_size())
    return True


def destroy_distributed(barrier: bool = True) -> None:
    """Destroy the default process group (after a barrier, so no rank leaves while another still talks to it)."""
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


class TorchDDPPlugin(DataParallelPlugin):
    """torch's ``DistributedDataParallel`` over the default group (or ``process_group``), when there are several
    ranks; gradients are averaged in buckets during the last micro-batch's backward."""

    def __init__(self, process_group=None, **ddp_kwargs):
        self.process_group = process_group
        self.ddp_kwargs = ddp_kwargs

    @property
    def world_size(self) -> int:
        if self.process_group is not None:
            return dist.get_world_size(self.process_group)
        return super().world_size

    @property
    def process_index(self) -> int:
        if self.process_group is not None:
            return dist.get_rank(self.process_group)
        return super().process_index

    def prepare(self, model, optimizer, args):
        if self.world_size <= 1:
            return model, optimizer
        kwargs = dict(self.ddp_kwargs)
        if args.ddp_find_unused_parameters is not None:
            kwargs.setdefault("find_unused_parameters", args.ddp_find_unused_parameters)
        elif getattr(model, "is_gradient_checkpointing", False):
            kwargs.setdefault("find_unused_parameters", False)  # transformers' default under checkpointing
        for name in ("bucket_cap_mb", "broadcast_buffers", "static_graph"):
            if getattr(args, f"ddp_{name}", None) is not None:
                kwargs.setdefault(name, getattr(args, f"ddp_{name}"))
        device_ids = [args.device.index] if args.device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, process_group=self.process_group, **kwargs
        )
        return wrapped, optimizer

    def no_sync(self, model):
        return model.no_sync() if isinstance(model, nn.parallel.DistributedDataParallel) else contextlib.nullcontext()

    def unwrap_model(self, model):
        return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM):
        if self.world_size > 1:
            dist.all_reduce(tensor, op=op, group=self.process_group)
        return tensor

    def broadcast_object(self, obj, src: int = 0):
        if self.world_size <= 1:
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=src, group=self.process_group)
        return holder[0]

    def all_gather_object(self, obj) -> list:
        if self.world_size <= 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.process_group)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.process_group)
