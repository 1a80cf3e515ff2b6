"""Every random number generator of the process as one picklable dict, and back: Python's ``random``, numpy's (only
when something loaded numpy: hf-lite does not depend on it), torch's CPU generator and each CUDA device's. The
Trainer writes it into each checkpoint per rank, so a resumed run draws what the uninterrupted one would have."""

from __future__ import annotations

import random
import sys

import torch


def get_rng_states() -> dict:
    states = {"python": random.getstate(), "cpu": torch.random.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in states:
        numpy.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if torch.cuda.is_available() and "cuda" in states:
        torch.cuda.random.set_rng_state_all(states["cuda"])
