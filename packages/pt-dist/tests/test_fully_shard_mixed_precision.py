"""FSDP2 mixed precision (issue 33), after torch's
test/distributed/_composable/fsdp/test_fully_shard_mixed_precision.py:
``TestFullyShardMixedPrecisionTraining`` (``test_compute_dtype``: param_dtype with reduce_dtype unset, which
torch 2.15 reduces in the original fp32; ``test_reduce_dtype``: bf16 reduction of fp32 parameters and fp32
reduction of bf16 compute; ``test_grad_acc_with_reduce_dtype``: accumulation without sync in ``reduce_dtype``;
fp16 reductions divided before and after a SUM) and ``TestFullyShardMixedPrecisionCasts`` (``output_dtype`` and
``cast_forward_inputs`` on submodules whose root has no policy). Every config trains side by side with torch's
``fully_shard`` on gloo in the same ranks: loss, output dtypes, every gradient (``full_tensor``, local shard,
dtype) and every parameter after ``Adam(foreach=False)``, bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_fully_shard_common import Compare, side_by_side, train_compare, two_worlds  # noqa: E402

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0, self.lin1, self.head = nn.Linear(6, 5), nn.Linear(5, 3), nn.Linear(3, 2)

    def forward(self, x):
        return self.head(torch.relu(self.lin1(torch.relu(self.lin0(x)))))


def _everywhere(policy):
    """The same policy on lin0, lin1 and the root (head)."""
    def shard(model, fully_shard, mesh, mp_policy=None):
        kwargs = {} if mp_policy is None else {"mp_policy": mp_policy}
        for m in (model.lin0, model.lin1, model):
            fully_shard(m, mesh=mesh, **kwargs)
    return shard, policy


def _submodules_only(model, fully_shard, mesh, mp_policy=None):
    """lin0 / lin1 compute in bf16 and hand fp32 back (output_dtype); the root (head) has no policy."""
    for m in (model.lin0, model.lin1):
        fully_shard(m, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh)


CONFIGS = {  # name: (shard, MixedPrecisionPolicy fields, micro-batches)
    "compute_bf16_reduce_unset": (*_everywhere({"param_dtype": BF16}), 1),
    "compute_bf16_reduce_fp32": (*_everywhere({"param_dtype": BF16, "reduce_dtype": FP32}), 1),
    "reduce_bf16_fp32_params": (*_everywhere({"reduce_dtype": BF16}), 1),
    "compute_bf16_reduce_bf16": (*_everywhere({"param_dtype": BF16, "reduce_dtype": BF16}), 1),
    "compute_fp16_reduce_fp16": (*_everywhere({"param_dtype": FP16, "reduce_dtype": FP16}), 1),
    "grad_acc_reduce_bf16": (*_everywhere({"reduce_dtype": BF16}), 2),
    "grad_acc_compute_bf16_reduce_fp32": (*_everywhere({"param_dtype": BF16, "reduce_dtype": FP32}), 3),
    "output_dtype_on_submodules": (_submodules_only, {"param_dtype": BF16, "output_dtype": FP32}, 1),
}


def _batch(rank):
    return lambda step, mb: torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * rank + 10 * step + mb))


def _parity(rank, world):
    out = {}
    with two_worlds(rank, world, "fs_mp"):
        for name, (shard, mp, micro) in CONFIGS.items():
            theirs, ours = side_by_side(Net, shard, mp=mp)
            out[name] = train_compare(Compare(f"{name} rank {rank}"), theirs, ours, _batch(rank), micro=micro)
        # what a submodule's forward saw: cast inputs, and the dtype it returned to the root
        seen = []
        for model in side_by_side(Net, _submodules_only, mp={"param_dtype": BF16, "output_dtype": FP32}):
            dtypes = []
            hook = model.lin1.register_forward_hook(
                lambda m, inp, o, dtypes=dtypes: dtypes.append((inp[0].dtype, o.dtype)))
            model(_batch(rank)(0, 0))
            hook.remove()
            seen.append(dtypes)
        out["seen"] = seen
    return out


@pytest.fixture(scope="module")
def parity():
    return run_ranks(_parity, 2, backend=None, timeout=240)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_mixed_precision_matches_torch_fully_shard(parity, config):
    for fails, count in (r[config] for r in parity):
        assert count > 20 and not fails, fails[:5]


def test_submodule_casts_inputs_and_outputs_as_torch(parity):
    for r in parity:
        theirs, ours = r["seen"]
        # a forward hook registered after fully_shard runs after FSDP's: bf16 in, and output_dtype's fp32 out
        assert ours == theirs == [(BF16, FP32)]
