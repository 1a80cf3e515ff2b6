"""RNG states for activation checkpointing and model-parallel regions (DeepSpeed's ``CudaRNGStatesTracker`` and
``model_parallel_cuda_manual_seed``, after Megatron-LM's ``tensor_parallel/random.py``).

A recomputed forward must draw the same random numbers as the original (dropout masks), so a checkpoint
records the default generators' states and the tracker's named states, and replays them. Inside
``get_cuda_rng_tracker().fork()`` a region (a tensor-parallel layer's dropout) draws from its own stream,
seeded differently per model-parallel rank, and the default stream is left untouched. On a machine
without CUDA the tracked generator is the CPU's, so the same code runs there.
"""

from __future__ import annotations

import contextlib

import torch

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"


def _accelerator():
    return torch.cuda if torch.cuda.is_available() else None


def _get_state() -> torch.Tensor:
    acc = _accelerator()
    return acc.get_rng_state() if acc is not None else torch.get_rng_state()


def _set_state(state: torch.Tensor) -> None:
    acc = _accelerator()
    if acc is not None:
        acc.set_rng_state(state)
    else:
        torch.set_rng_state(state)


class CudaRNGStatesTracker:
    """Named RNG states (DeepSpeed's name kept; the tracked generator is CUDA's, or the CPU's without CUDA)."""

    def __init__(self):
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        """A new dict of the stored states themselves (a fork replaces a state, never writes into one)."""
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists in the RNG tracker")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} already exists in the tracker")
        self.seeds_.add(seed)
        orig = _get_state()
        acc = _accelerator()
        (acc.manual_seed if acc is not None else torch.manual_seed)(seed)
        self.states_[name] = _get_state()
        _set_state(orig)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG_TRACKER_NAME):
        """Draw from ``name``'s stream inside the block; the default stream resumes where it was."""
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} is not added to the tracker (model_parallel_cuda_manual_seed)")
        orig = _get_state()
        _set_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _get_state()
            _set_state(orig)


_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _TRACKER


def model_parallel_cuda_manual_seed(seed: int, model_parallel_rank: int = 0) -> None:
    """Megatron's seeding: the default stream gets ``seed`` on every rank (data-parallel regions agree), the
    tracked model-parallel stream ``seed + 2718 + model_parallel_rank`` (tensor-parallel shards differ)."""
    _TRACKER.reset()
    acc = _accelerator()
    (acc.manual_seed if acc is not None else torch.manual_seed)(seed)
    _TRACKER.add(_MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + model_parallel_rank)


def capture() -> tuple:
    """Everything a recompute needs to replay: CPU, CUDA (when present) and the tracker's states."""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda, _TRACKER.get_states()


def restore(states: tuple) -> None:
    cpu, cuda, tracked = states
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)
    _TRACKER.set_states(dict(tracked))  # the capture stays as it was for a second replay
