"""Vocab-parallel cross-entropy against the numbers Megatron's own test expects.

Ports Megatron-LM's ``tests/unit_tests/tensor_parallel/test_cross_entropy.py`` (test_vocab_parallel_cross_entropy)
to mega_par at the same tensor-parallel size, 4: every rank holds logits 0..7 repeated over its 32-entry vocab
slice, targets 0, 2, ..., 30 all fall in rank 0's slice, and the loss rounds to upstream's values. Not ported:
the explicit ``tp_group`` argument cases (mega_par reads the group from parallel_state). Also checked against
``F.cross_entropy`` on the gathered logits. Runs inside the package's shared 8-rank run (``rank_cases``).
"""

import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F
from mega_par import parallel_state as ps
from mega_par.tensor_parallel import vocab_parallel_cross_entropy

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

UPSTREAM = [10.2309, 8.2309, 6.2309, 4.2309] * 4


def _vocab_parallel_cross_entropy(rank, world):
    ps.initialize_model_parallel(4, 1)
    try:
        logits = torch.arange(0, 8, dtype=torch.float32).repeat(16, 4)  # [16, 32] on every rank
        target = torch.arange(0, 32, 2)
        out = vocab_parallel_cross_entropy(logits, target)
        assert torch.equal(torch.round(out), torch.round(torch.tensor(UPSTREAM))), out
        torch.testing.assert_close(out, torch.tensor(UPSTREAM), rtol=0, atol=1e-4)
        full = logits.repeat(1, 4)  # the gathered [16, 128] logits
        torch.testing.assert_close(out, F.cross_entropy(full, target, reduction="none"))
    finally:
        ps.destroy_model_parallel()


CASES = {"vocab_parallel_cross_entropy": _vocab_parallel_cross_entropy}


def rank_cases(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_cross_entropy_at_tp4(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_cross_entropy"), case)
