"""Weight decay in the optimizers (``optimizer/``): biases and 1-D parameters (norm weights) take none by default.

Megatron's ``get_megatron_optimizer`` splits parameters into a decayed and a non-decayed group with
``no_weight_decay_cond`` (default: ``name.endswith(".bias") or param.dim() == 1``); so do the plain and the
distributed optimizer here. With zero gradients an AdamW step is exactly ``p * (1 - lr * wd)`` on a decayed
parameter and leaves the others untouched, so the test reads the groups off the parameters themselves. The
distributed case runs at dp=4 with small buckets, so parameters straddle DP shards (each shard is cut into
per-parameter pieces) and the updated shards are all-gathered back. The cases run inside the package's shared
8-rank run (``rank_cases``) on 4 ranks.
"""

import importlib.util
import pathlib

import pytest
import torch
from mega_par import parallel_state as ps
from mega_par.distributed import DistributedDataParallel, DistributedDataParallelConfig
from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
from mega_par.optimizer import OptimizerConfig, get_megatron_optimizer
from mega_par.transformer import TransformerConfig

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

LR, WD = 0.1, 0.5
# a GPT-2-style layer: LayerNorm weights and biases, linear biases, learned positions (2-D, decayed)
CONFIG = TransformerConfig(
    num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32, normalization="LayerNorm",
    add_bias_linear=True, hidden_dropout=0.0, attention_dropout=0.0,
)  # fmt: skip


def _step_with_zero_grads(use_distributed_optimizer, no_weight_decay_cond=None):
    """Every parameter's (name, value before, value after) one AdamW step with zero gradients."""
    model = GPTModel(CONFIG, get_gpt_layer_local_spec(), 32, 8, position_embedding_type="learned_absolute", seed=0)
    ddp = DistributedDataParallel(
        CONFIG,
        DistributedDataParallelConfig(use_distributed_optimizer=use_distributed_optimizer, bucket_size=300),
        model,
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(lr=LR, weight_decay=WD, use_distributed_optimizer=use_distributed_optimizer), [ddp],
        no_weight_decay_cond,
    )  # fmt: skip
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.zero_grad()
    opt.step()
    return [(n, before[n], p.detach()) for n, p in model.named_parameters()], ddp


def _check_groups(results, decayed) -> None:
    assert any(decayed(n, b) for n, b, _ in results) and not all(decayed(n, b) for n, b, _ in results)
    for name, before, after in results:
        if decayed(name, before):
            torch.testing.assert_close(after, before * (1 - LR * WD), msg=f"{name} must decay")
        else:
            torch.testing.assert_close(after, before, rtol=0, atol=0, msg=f"{name} must not decay")


def _megatron_default(name, p):
    return not (name.endswith(".bias") or p.dim() == 1)


def _plain_optimizer():
    with _mpu():
        results, _ = _step_with_zero_grads(False)
    _check_groups(results, _megatron_default)
    names = {n for n, b, _ in results if not _megatron_default(n, b)}
    assert "decoder.final_layernorm.weight" in names and "decoder.layers.0.mlp.linear_fc1.bias" in names


def _distributed_optimizer():
    with _mpu():
        results, ddp = _step_with_zero_grads(True)
        dp = ps.get_data_parallel_world_size()
        buf = ddp.buffer
        straddling = [
            p for b in buf.buckets for p in b.params
            if len({min((i - b.offset) * dp // b.grad_data.numel(), dp - 1) for i in buf.param_index_map[p]}) > 1
        ]  # fmt: skip
    assert dp == 4 and straddling, "some parameter must span two DP shards, or the piece cutting is not exercised"
    _check_groups(results, _megatron_default)


def _custom_cond():
    """``no_weight_decay_cond`` replaces the default: here everything decays, norm weights and biases included."""
    with _mpu():
        results, _ = _step_with_zero_grads(True, no_weight_decay_cond=lambda name, p: False)
    for name, before, after in results:
        torch.testing.assert_close(after, before * (1 - LR * WD), msg=f"{name} must decay")


class _mpu:
    def __enter__(self):
        ps.initialize_model_parallel(1, 1)  # dp = the world (4)

    def __exit__(self, *exc):
        ps.destroy_model_parallel()


CASES = {
    "megatron_optimizer_default_no_weight_decay": _plain_optimizer,
    "distributed_optimizer_default_no_weight_decay": _distributed_optimizer,
    "custom_no_weight_decay_cond": _custom_cond,
}


def rank_cases(rank, world):
    return H.run_cases(CASES)


@pytest.mark.world_size(4)
@pytest.mark.parametrize("case", list(CASES))
def test_weight_decay_groups(mega_par_ranks, case):
    H.assert_case(H.job_results(mega_par_ranks, "test_optimizer"), case)
