"""miniframes' multi-rank test harness: ``run_ranks`` plus the ``gpu(n)``/``world_size(n)`` markers."""

from harness.ranks import RankError, resolve_backend, run_ranks
from harness.worker import store

__all__ = ["RankError", "resolve_backend", "run_ranks", "store", "cuda_device_count"]


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
