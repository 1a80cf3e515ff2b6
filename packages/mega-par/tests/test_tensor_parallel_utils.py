"""``tensor_parallel.utils`` and ``tensor_parallel.data`` on 2 gloo ranks (TP=2). Ports Megatron's
``tests/unit_tests/tensor_parallel/test_tensor_parallel_utils.py`` (test_split_tensor_along_last_dim,
test_split_tensor_into_1d_equal_chunks, test_gather_split_1d_tensor, test_vocab; at TP=2 PP=1 where upstream uses
TP=2 PP=4) and ``test_data.py`` (test_broadcast_data, where here the second rank passes other tensors, so the
check can fail), plus the tensor-parallel attribute helpers of ``layers.py``."""

import importlib.util
import pathlib

import pytest
import torch

import harness

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)


def _split_along_last_dim(rank, world):
    from mega_par.tensor_parallel import split_tensor_along_last_dim

    x = torch.rand((3, 4))
    chunks = split_tensor_along_last_dim(x, 2)
    assert torch.equal(chunks[0], x[:, 0:2]) and torch.equal(chunks[1], x[:, 2:4])
    assert all(c.is_contiguous() for c in split_tensor_along_last_dim(x, 2, contiguous_split_chunks=True))
    with pytest.raises(ValueError, match="not divisible by num_partitions 3"):
        split_tensor_along_last_dim(x, 3)


def _one_d_chunks(rank, world):
    from mega_par import parallel_state as ps
    from mega_par.tensor_parallel.utils import gather_split_1d_tensor, split_tensor_into_1d_equal_chunks

    ps.initialize_model_parallel(2, 1)
    try:
        x = torch.arange(12.0).view(3, 4)
        piece = split_tensor_into_1d_equal_chunks(x)
        assert torch.equal(piece, x.flatten()[6 * rank:6 * rank + 6])
        assert piece.data_ptr() == x.flatten()[6 * rank:].data_ptr()
        assert split_tensor_into_1d_equal_chunks(x, new_buffer=True).data_ptr() != piece.data_ptr()
        mine = torch.ones((2, 4)) * rank
        assert torch.equal(gather_split_1d_tensor(mine), torch.cat((torch.zeros(8), torch.ones(8))))
    finally:
        ps.destroy_model_parallel()


def _vocab(rank, world):
    from mega_par.tensor_parallel.utils import VocabUtility

    per = 1600 // world
    assert VocabUtility.vocab_range_from_per_partition_vocab_size(per, rank, world) == (rank * per, (rank + 1) * per)
    assert VocabUtility.vocab_range_from_global_vocab_size(1600, rank, world) == (rank * per, (rank + 1) * per)
    with pytest.raises(ValueError, match="1601 is not divisible"):
        VocabUtility.vocab_range_from_global_vocab_size(1601, rank, world)


def _broadcast_data(rank, world):
    from mega_par import parallel_state as ps
    from mega_par.tensor_parallel.data import broadcast_data

    ps.initialize_model_parallel(2, 1)
    try:
        data = {k: torch.ones((8, 8)) * k + 100 * rank for k in range(8)}
        data["tokens"] = torch.arange(6.0).view(2, 3) + 100 * rank
        out = broadcast_data([0, 1, "tokens"], data, torch.float32)
        assert torch.equal(out[0], torch.zeros(8, 8)) and torch.equal(out[1], torch.ones(8, 8))
        assert torch.equal(out["tokens"], torch.arange(6.0).view(2, 3))
        if rank == 0:
            with pytest.raises(TypeError, match="different than torch.int64"):
                broadcast_data([0], data, torch.int64)
    finally:
        ps.destroy_model_parallel()


def _attributes(rank, world):
    from mega_par.tensor_parallel import (
        copy_tensor_model_parallel_attributes,
        set_defaults_if_not_set_tensor_model_parallel_attributes,
        set_tensor_model_parallel_attributes,
    )

    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    set_defaults_if_not_set_tensor_model_parallel_attributes(a)
    assert (a.tensor_model_parallel, a.partition_dim, a.partition_stride) == (False, -1, 1)
    set_tensor_model_parallel_attributes(a, True, 0, 2)
    set_defaults_if_not_set_tensor_model_parallel_attributes(a)  # keeps what is set
    copy_tensor_model_parallel_attributes(b, a)
    assert (b.tensor_model_parallel, b.partition_dim, b.partition_stride) == (True, 0, 2)


CASES = {"split_along_last_dim": _split_along_last_dim, "one_d_chunks": _one_d_chunks, "vocab": _vocab,
         "broadcast_data": _broadcast_data, "attributes": _attributes}


def _rank_main(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.fixture(scope="module")
def results():
    return harness.run_ranks(_rank_main, 2, backend="gloo", timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel_utils_case(results, case):
    H.assert_case(results, case)
