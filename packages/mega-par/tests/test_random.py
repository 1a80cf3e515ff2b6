"""The RNG tracker, model_parallel_cuda_manual_seed and checkpoint (``tensor_parallel/random.py``).

Ports Megatron-LM's ``tests/unit_tests/tensor_parallel/test_random.py`` to mega_par on the CPU generator (the
tracker's generator when there is no GPU): test_cuda_rng_states_tracker, test_double_fork_cuda_rng_states_tracker
(a nested fork of the same state continues its stream), test_model_parallel_cuda_manual_seed and test_checkpoint.
Not ported: the CUDA-graph-safe RNG and CheckpointWithoutOutput, which mega_par does not have. Added: seeding
the tracker leaves the default CPU generator alone, as Megatron's (which touches only CUDA's), while the TP state
differs over the TP group and the DP state does not. The seeding cases need parallel state and run inside the
package's shared 8-rank run (``rank_cases``).
"""

import importlib.util
import pathlib

import pytest
import torch
import torch.distributed as dist
from mega_par import parallel_state as ps
from mega_par.tensor_parallel.random import (
    RNGStatesTracker,
    checkpoint,
    get_cuda_rng_tracker,
    model_parallel_cuda_manual_seed,
)

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)


def test_rng_states_tracker():
    tracker = RNGStatesTracker()
    tracker.set_states({"state1": 1234})  # Megatron's test stores an opaque value: states are kept as given
    assert tracker.get_states()["state1"] == 1234
    stored = tracker.get_states()
    stored["other"] = 0
    assert "other" not in tracker.get_states()  # a new dict each time, of the same states
    tracker.reset()
    assert tracker.get_states() == {}
    seed = 1111
    tracker.add("state2", seed)
    with pytest.raises(ValueError, match="seed 1111 already exists"):
        tracker.add("state3", seed)
    with pytest.raises(ValueError, match="'state2' already exists"):
        tracker.add("state2", 111)
    with pytest.raises(KeyError, match="'missing' is not added"):
        with tracker.fork("missing"):
            pass
    outside = torch.get_rng_state()
    torch.manual_seed(seed)
    assert torch.equal(tracker.get_states()["state2"], torch.get_rng_state()), "add() stores the seeded state"
    torch.set_rng_state(outside)


def test_double_fork_continues_each_stream():
    """A fork nested in a fork of another state, itself forking the first state again, draws exactly what
    consecutive single forks draw; the default generator is back where it was afterwards."""
    outside = torch.get_rng_state()
    tracker = RNGStatesTracker()
    tracker.add("state1", 1234)
    tracker.add("state2", 5678)
    nested_1, nested_2 = [], []
    with tracker.fork("state1"):
        nested_1.append(torch.randn(10))
        with tracker.fork("state2"):
            nested_2.append(torch.randn(10))
            with tracker.fork("state1"):
                nested_1.append(torch.randn(10))
            nested_2.append(torch.randn(10))
        nested_1.append(torch.randn(10))
    nested_states = tracker.get_states()
    assert torch.equal(torch.get_rng_state(), outside)

    tracker.reset()
    tracker.add("state1", 1234)
    tracker.add("state2", 5678)
    with tracker.fork("state1"):
        single_1 = [torch.randn(10) for _ in range(3)]
    with tracker.fork("state2"):
        single_2 = [torch.randn(10) for _ in range(2)]
    for a, b in zip(nested_1 + nested_2, single_1 + single_2):
        assert torch.equal(a, b)
    for name, state in tracker.get_states().items():
        assert torch.equal(nested_states[name], state), name


def test_checkpoint_without_distributed_saved_activations():
    def add(*inputs):
        return inputs[0] + inputs[1]

    assert torch.equal(checkpoint(add, None, torch.ones(16), torch.ones(16) * 2), torch.ones(16) * 3)
    a = torch.ones(4, 4, requires_grad=True)
    out = checkpoint(add, False, a, torch.ones(4, 4) * 2)
    out.sum().backward()
    assert torch.equal(a.grad, torch.ones(4, 4))
    # upstream then checkpoints with distribute_saved_activations=True (inputs sharded over TP): not supported
    with pytest.raises(ValueError, match="distribute_saved_activations=True is not supported"):
        checkpoint(add, True, a, torch.ones(4, 4))


def _model_parallel_cuda_manual_seed(rank, world):
    ps.initialize_model_parallel(2, world // 2)  # TP groups [0, 1], [2, 3]
    try:
        torch.manual_seed(99)
        before = torch.get_rng_state()
        model_parallel_cuda_manual_seed(0)
        assert torch.equal(torch.get_rng_state(), before), "the default CPU generator must not be re-seeded"
        states = get_cuda_rng_tracker().get_states()
        assert set(states) == {"model-parallel-rng", "data-parallel-rng"}
        with get_cuda_rng_tracker().fork():
            tp_draw = torch.rand(4)
        with get_cuda_rng_tracker().fork("data-parallel-rng"):
            dp_draw = torch.rand(4)
        draws = [torch.empty(2, 4) for _ in range(world)]
        dist.all_gather(draws, torch.stack([tp_draw, dp_draw]))
        mate = rank ^ 1  # the other rank of this TP group
        assert not torch.equal(draws[rank][0], draws[mate][0]), "TP states differ over the TP group"
        assert torch.equal(draws[rank][0], draws[(rank + 2) % world][0]), "same TP rank, same TP state"
        assert all(torch.equal(d[1], draws[0][1]) for d in draws), "the data-parallel state is the same everywhere"
        assert torch.equal(torch.get_rng_state(), before), "forks restore the default generator"
    finally:
        ps.destroy_model_parallel()


CASES = {"model_parallel_cuda_manual_seed": _model_parallel_cuda_manual_seed}


def rank_cases(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_seeding_on_four_ranks(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_random"), case)
