"""Training utilities DeepSpeed's scripts call (``deepspeed/runtime/utils.py``)."""

from __future__ import annotations

import random
import sys

import torch


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
