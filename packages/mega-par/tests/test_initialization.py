"""Tensor-parallel layers hold exactly the TP=1 layer's slice when built under the same default seed.

Ports Megatron-LM's ``tests/unit_tests/tensor_parallel/test_initialization.py`` (test_embedding_init,
test_row_init, test_col_init; not the Transformer Engine ones) to mega_par on CPU: torch.manual_seed(42) both
times, model_parallel_cuda_manual_seed(42) for TP=1 and (intentionally different) 41 for TP=4, and the TP=4
shard equals the TP=1 weight's slice. That holds only because seeding the tracker leaves the default generator,
from which weights are drawn, alone. Runs inside the package's shared 8-rank run (``rank_cases``).
"""

import importlib.util
import pathlib

import pytest
import torch
from mega_par import parallel_state as ps
from mega_par.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from mega_par.tensor_parallel.random import model_parallel_cuda_manual_seed
from mega_par.transformer import TransformerConfig

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

CONFIG = TransformerConfig(num_layers=1, hidden_size=12, num_attention_heads=4)
BUILD = {
    "embedding": (
        lambda: VocabParallelEmbedding(
            num_embeddings=16, embedding_dim=4, init_method=CONFIG.init_method, config=CONFIG
        ),
        0,
    ),
    "row": (
        lambda: RowParallelLinear(
            input_size=16,
            output_size=16,
            init_method=CONFIG.init_method,
            bias=True,
            input_is_parallel=False,
            config=CONFIG,
            skip_bias_add=False,
        ),
        1,
    ),
    "col": (
        lambda: ColumnParallelLinear(
            input_size=16, output_size=16, init_method=CONFIG.init_method, bias=True, config=CONFIG, skip_bias_add=False
        ),
        0,
    ),
}


def _init_case(kind):
    build, dim = BUILD[kind]
    ps.initialize_model_parallel(1, 1)
    try:
        torch.manual_seed(42)
        model_parallel_cuda_manual_seed(42)
        tp1 = build().weight.detach()
    finally:
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(4, 1)
    try:
        torch.manual_seed(42)
        model_parallel_cuda_manual_seed(41)  # intentionally different
        tp4 = build().weight.detach()
        rank = ps.get_tensor_model_parallel_rank()
    finally:
        ps.destroy_model_parallel()
    assert tp4.shape[dim] * 4 == tp1.shape[dim]
    assert torch.equal(tp1.narrow(dim, rank * 4, 4), tp4)


CASES = {f"{kind}_init": (lambda k=kind: _init_case(k)) for kind in BUILD}


def rank_cases(rank, world):
    return H.run_cases(CASES)


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_tp4_shard_equals_tp1_slice(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_initialization"), case)
