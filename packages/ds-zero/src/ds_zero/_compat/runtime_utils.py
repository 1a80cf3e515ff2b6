"""Training utilities DeepSpeed's scripts call (``deepspeed/runtime/utils.py``)."""

from __future__ import annotations

import math
import os
import random
import sys

import torch

from ds_zero._compat.accelerator import get_accelerator


def set_random_seed(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator (when numpy is loaded) and torch, as DeepSpeed does
    (numpy takes 32 bits, torch 64: larger seeds are reduced modulo those)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"set_random_seed(seed={seed!r}) takes an int")
    random.seed(seed)
    numpy = sys.modules.get("numpy")  # ds-zero does not depend on numpy; torch loads it when it is installed
    if numpy is not None:
        numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed % (2**63))


def ensure_directory_exists(filename) -> None:
    """Create the folder ``filename`` would be written into."""
    os.makedirs(os.path.dirname(filename), exist_ok=True)


def get_global_norm(norm_list) -> float:
    """The norm of the norms (sqrt of their squares' sum); inf when any is not finite or negative (DeepSpeed's -1
    marks an invalid norm)."""
    norms = [float(n) for n in norm_list]
    if any(not math.isfinite(n) or n < 0 for n in norms):
        return float("inf")
    return math.sqrt(sum(n * n for n in norms))


def empty_cache() -> None:
    """The accelerator's cached memory released and its peak statistics reset."""
    get_accelerator().empty_cache()
    get_accelerator().reset_peak_memory_stats()
