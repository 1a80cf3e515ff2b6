"""RNG tracker and activation checkpointing that replays RNG (Megatron ``tensor_parallel/random.py``).

Inside a tensor-parallel region every rank holds a different shard, so dropout there must draw
different masks per rank; outside it (on replicated activations) masks must match across the TP group.
The tracker keeps named RNG states and swaps them into the default generator inside ``fork()``.
Megatron tracks CUDA generators; this one tracks whichever device is in use (CPU when there is no GPU).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import detach_variable

from mega_par import parallel_state as ps

_MODEL_PARALLEL_RNG_TRACKER_NAME = "model-parallel-rng"
_DATA_PARALLEL_RNG_TRACKER_NAME = "data-parallel-rng"
_DEFAULT_RNG_NAME = "default-rng"  # the default generator itself, never stored in the tracker
# Megatron's offset between the data-parallel seed and the tensor-parallel seed.
_TP_SEED_OFFSET = 2718


def _use_cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _get_rng_state():
    return torch.cuda.get_rng_state() if _use_cuda() else torch.get_rng_state()


def _set_rng_state(state) -> None:
    if _use_cuda():
        torch.cuda.set_rng_state(state)
    else:
        torch.set_rng_state(state)


def _seeded_state(seed: int):
    gen = torch.Generator(device="cuda" if _use_cuda() else "cpu")
    gen.manual_seed(seed)
    return gen.get_state()


class RNGStatesTracker:
    """Named RNG states; ``fork(name)`` runs a block on that state and advances it (Megatron's
    ``CudaRNGStatesTracker``).

    The tracker remembers which state is swapped in, so a nested ``fork`` (of another state, or of the same
    one) first stores the outer state's progress: the inner block continues the outer stream instead of
    replaying it from where the outer ``fork`` began.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._current_state_name = _DEFAULT_RNG_NAME

    def get_states(self) -> dict:
        """A new dict of the states as stored (Megatron's: a fork replaces a state, never writes into one)."""
        return dict(self.states_)

    def set_states(self, states: dict) -> None:
        """Keep ``states`` as given; Megatron does not check or copy them."""
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists in the RNG tracker")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} already exists in the RNG tracker")
        self.seeds_.add(seed)
        self.states_[name] = _seeded_state(seed)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} is not added; call model_parallel_cuda_manual_seed first")
        outer_name, outer_state = self._current_state_name, _get_rng_state()
        if outer_name != _DEFAULT_RNG_NAME:
            self.states_[outer_name] = outer_state  # the generator holds the outer fork's progress: keep it
        _set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            self.states_[name] = _get_rng_state()
            # an inner fork of the outer state advanced it: resume from there, not from where we entered
            _set_rng_state(self.states_[outer_name] if outer_name != _DEFAULT_RNG_NAME else outer_state)
            self._current_state_name = outer_name


_TRACKER = RNGStatesTracker()


def get_cuda_rng_tracker() -> RNGStatesTracker:
    """Megatron's name; on a CPU-only machine the tracked generator is the CPU one."""
    return _TRACKER


get_rng_tracker = get_cuda_rng_tracker


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the tracker: a data-parallel state (``seed``, equal over the TP group) and the tensor-parallel
    state (``seed + 2718 + tp_rank``, different per TP rank).

    As Megatron, the only default generator touched is CUDA's (``torch.cuda.manual_seed``, when CUDA is in
    use); the default CPU generator is the caller's (Megatron's ``_set_random_seed`` calls
    ``torch.manual_seed`` itself), so seeding the tracker never changes what the CPU draws next.
    """
    tp_seed = seed + _TP_SEED_OFFSET + ps.get_tensor_model_parallel_rank()
    _TRACKER.reset()
    if _use_cuda():
        torch.cuda.manual_seed(seed)
    _TRACKER.add(_DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    _TRACKER.add(_MODEL_PARALLEL_RNG_TRACKER_NAME, tp_seed)


class CheckpointFunction(torch.autograd.Function):
    """Drop activations in forward; in backward restore the RNG states of forward and recompute.

    Restoring both the default and the tracker's states makes recomputed dropout masks equal the originals.
    """

    @staticmethod
    def forward(ctx, run_function, *args):
        ctx.run_function = run_function
        ctx.fwd_rng_state = _get_rng_state()
        ctx.fwd_tracker_states = _TRACKER.get_states()
        with torch.no_grad():
            outputs = run_function(*args)
        ctx.save_for_backward(*[a for a in args if torch.is_tensor(a)])
        ctx.arg_is_tensor = [torch.is_tensor(a) for a in args]
        ctx.non_tensor_args = [a for a in args if not torch.is_tensor(a)]
        return outputs

    @staticmethod
    def backward(ctx, *grads):
        tensors, others = iter(ctx.saved_tensors), iter(ctx.non_tensor_args)
        args = [next(tensors) if t else next(others) for t in ctx.arg_is_tensor]
        inputs = detach_variable(tuple(args))
        bwd_rng_state, bwd_tracker_states = _get_rng_state(), _TRACKER.get_states()
        _set_rng_state(ctx.fwd_rng_state)
        _TRACKER.set_states(dict(ctx.fwd_tracker_states))  # the saved states stay as saved for a second backward
        try:
            with torch.enable_grad():
                outputs = ctx.run_function(*inputs)
        finally:
            _set_rng_state(bwd_rng_state)
            _TRACKER.set_states(bwd_tracker_states)
        if torch.is_tensor(outputs):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *[a.grad if torch.is_tensor(a) else None for a in inputs])


def checkpoint(function, distribute_saved_activations: bool, *args):
    """Megatron's signature; ``distribute_saved_activations`` (sharding saved inputs over TP) is not supported."""
    if distribute_saved_activations:
        raise ValueError("distribute_saved_activations=True is not supported by mega_par's checkpoint")
    return CheckpointFunction.apply(function, *args)
