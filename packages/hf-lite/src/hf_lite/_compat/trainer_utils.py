"""The rest of transformers' ``trainer_utils.py`` / ``trainer_pt_utils.py`` helpers scripts call directly:
``enable_full_determinism`` and ``torch_distributed_zero_first``."""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from ..trainer_utils import set_seed


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """``set_seed`` plus deterministic kernels: torch's deterministic algorithms, cuDNN without autotuning, and the
    CUDA / cuBLAS environment variables that make their kernels reproducible (transformers' ``trainer_utils``)."""
    set_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    os.environ["ASCEND_LAUNCH_BLOCKING"] = "1"
    os.environ["HCCL_DETERMINISTIC"] = "1"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def torch_distributed_zero_first(local_rank: int):
    """Rank ``local_rank`` 0 (or -1: not distributed) runs the block first, the others after it (a cache the first
    one writes and the rest read)."""
    waits = local_rank not in (-1, 0) and dist.is_available() and dist.is_initialized()
    if waits:
        dist.barrier()
    yield
    if local_rank == 0 and dist.is_available() and dist.is_initialized():
        dist.barrier()
