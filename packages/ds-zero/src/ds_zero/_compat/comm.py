"""``deepspeed.init_distributed`` (``deepspeed/comm/comm.py``): join the job torchrun (or the environment)
describes, with DeepSpeed's defaults."""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def _default_timeout() -> datetime.timedelta:
    return datetime.timedelta(minutes=int(os.environ.get("DEEPSPEED_TIMEOUT", "30")))  # DeepSpeed's default


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout: datetime.timedelta | None = None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config=None, rank: int = -1,
                     world_size: int = -1) -> None:
    """Without the launcher's variables it is one process on this machine (DeepSpeed tries MPI discovery there;
    mpi4py is not used here). ``dist_backend`` defaults to nccl with CUDA, else gloo; ``DEEPSPEED_TIMEOUT``
    (minutes) sets the timeout."""
    if dist.is_initialized():
        return
    if dist_init_required is False:
        raise RuntimeError("torch.distributed is not initialised and dist_init_required=False; call "
                           "dist.init_process_group first")
    if config is not None:  # DeepSpeed reads only its comms-logger section from it; ds-zero has no comms logger
        logger.warning("init_distributed(config=...): DeepSpeed's comms logging is not built in ds_zero; ignored")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout={timeout!r} must be a datetime.timedelta")
    if init_method is None:
        if verbose and "RANK" not in os.environ:
            logger.info("no launcher environment (RANK, WORLD_SIZE, ...): one process on 127.0.0.1:%d",
                        distributed_port)
        for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                             ("MASTER_PORT", str(distributed_port))):
            os.environ.setdefault(key, default)
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs = {"timeout": timeout or _default_timeout(), "init_method": init_method}
    if rank >= 0 or world_size >= 0:  # a tcp:// or file:// init_method needs them
        kwargs.update(rank=rank, world_size=world_size)
    dist.init_process_group(backend, **kwargs)
