"""The communication regions (f, g, scatter/gather, SP g and g-bar) on rank-valued inputs.

Ports Megatron-LM's ``tests/unit_tests/tensor_parallel/test_mappings.py`` to mega_par: each autograd Function's
forward and backward is called directly on tensors filled with the rank, and the result is the sum or
concatenation over the tensor-parallel group. Upstream runs tp=4 x pp=2 on 8 GPUs; here tp=2 x pp=2 on 4 ranks,
so each expected value is written for the TP group this rank is in ([0, 1] or [2, 3]). The cases run inside the
package's shared 8-rank run (``rank_cases``).
"""

import importlib.util
import pathlib
from types import SimpleNamespace

import pytest
import torch
from mega_par import parallel_state as ps
from mega_par.tensor_parallel import mappings

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

TP = 2


def _group_ranks(rank):
    first = rank - rank % TP
    return list(range(first, first + TP))


def _copy_to(rank):
    x = torch.ones(1) * rank
    assert torch.equal(mappings._CopyToModelParallelRegion.backward(None, x), torch.ones(1) * sum(_group_ranks(rank)))
    assert torch.equal(mappings.copy_to_tensor_model_parallel_region(x), x)


def _reduce_from(rank):
    x = torch.ones(1) * rank
    assert torch.equal(mappings.reduce_from_tensor_model_parallel_region(x), torch.ones(1) * sum(_group_ranks(rank)))
    x = torch.ones(1) * rank
    assert torch.equal(mappings._ReduceFromModelParallelRegion.backward(None, x), x)


def _scatter_to(rank):
    x = torch.rand((8, 4), generator=torch.Generator().manual_seed(0))  # the same on every rank
    r = rank % TP
    assert torch.equal(mappings.scatter_to_tensor_model_parallel_region(x), x[:, 2 * r : 2 * r + 2])
    got = mappings._ScatterToModelParallelRegion.backward(None, torch.ones(8) * rank)
    assert torch.equal(got, torch.cat([torch.ones(8) * g for g in _group_ranks(rank)]))


def _gather_from(rank):
    x = torch.rand((8, 4), generator=torch.Generator().manual_seed(0))
    r = rank % TP
    assert torch.equal(mappings._GatherFromModelParallelRegion.backward(None, x), x[:, 2 * r : 2 * r + 2])
    got = mappings.gather_from_tensor_model_parallel_region(torch.ones(8) * rank)
    assert torch.equal(got, torch.cat([torch.ones(8) * g for g in _group_ranks(rank)]))


def _scatter_to_sequence(rank):
    x = torch.rand((8, 4), generator=torch.Generator().manual_seed(0))
    r = rank % TP
    assert torch.equal(mappings.scatter_to_sequence_parallel_region(x), x[4 * r : 4 * r + 4])
    got = mappings._ScatterToSequenceParallelRegion.backward(None, torch.ones(4) * rank)
    assert torch.equal(got, torch.cat([torch.ones(4) * g for g in _group_ranks(rank)]))


def _gather_from_sequence(rank):
    got = mappings.gather_from_sequence_parallel_region(torch.ones(4) * rank)
    assert torch.equal(got, torch.cat([torch.ones(4) * g for g in _group_ranks(rank)]))
    # backward into a tensor-parallel consumer: reduce-scatter, so row r summed over the group
    rows = torch.vstack([torch.ones(4) * i for i in range(TP)])
    ctx = SimpleNamespace(tensor_parallel_output_grad=True)
    grad, _ = mappings._GatherFromSequenceParallelRegion.backward(ctx, rows)
    assert torch.equal(grad[0], torch.ones(4) * TP * (rank % TP))
    # into a replicated consumer (gathering for the loss): each rank keeps its own chunk, no sum
    grad, _ = mappings._GatherFromSequenceParallelRegion.backward(
        SimpleNamespace(tensor_parallel_output_grad=False), rows
    )
    assert torch.equal(grad[0], torch.ones(4) * (rank % TP))


def _reduce_scatter_to_sequence(rank):
    rows = torch.vstack([torch.ones(4) * i for i in range(TP)])
    got = mappings.reduce_scatter_to_sequence_parallel_region(rows)
    assert torch.equal(got, (torch.ones(4) * TP * (rank % TP)).reshape(1, 4))
    got = mappings._ReduceScatterToSequenceParallelRegion.backward(None, torch.ones(4) * rank)
    assert torch.equal(got, torch.cat([torch.ones(4) * g for g in _group_ranks(rank)]))


CASES = {
    "CopyToModelParallelRegion": _copy_to,
    "ReduceFromModelParallelRegion": _reduce_from,
    "ScatterToModelParallelRegion": _scatter_to,
    "GatherFromModelParallelRegion": _gather_from,
    "ScatterToSequenceParallelRegion": _scatter_to_sequence,
    "GatherFromSequenceParallelRegion": _gather_from_sequence,
    "ReduceScatterToSequenceParallelRegion": _reduce_scatter_to_sequence,
}


def rank_cases(rank, world):
    ps.initialize_model_parallel(TP, world // TP)
    try:
        return H.run_cases({name: (lambda f=f: f(rank)) for name, f in CASES.items()})
    finally:
        ps.destroy_model_parallel()


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_mapping(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_mappings"), case)
