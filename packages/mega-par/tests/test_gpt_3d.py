"""3D-parallel GPT training: loss curves over 5 steps equal a single-process run of the same model and data.

All (tp, pp, dp) layouts of the issue, with and without sequence parallelism and the distributed optimizer,
run in one 8-rank call: each round splits the ranks into independent jobs, each job its own
``torch.distributed`` world (so a 2-rank and a 4-rank layout train side by side).
"""

import dataclasses
import datetime
import time

import pytest
import torch
import torch.distributed as dist
from mega_par.training import TrainingArgs, pretrain

import harness
from harness import run_ranks

LLAMA = dict(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
             vocab_size=64, seq_length=16, micro_batch_size=2, train_iters=5, lr=3e-3, seed=7)
GPT2 = dict(LLAMA, normalization="LayerNorm", position_embedding_type="learned_absolute", swiglu=False,
            add_bias_linear=True, untie_embeddings_and_output_weights=False, num_query_groups=None)
GLOBAL_MICROBATCHES = 4  # micro-batches of the whole global batch: dp * num_microbatches


def _args(family, tp=1, pp=1, dp=1, **kw):
    base = LLAMA if family == "llama" else GPT2
    return TrainingArgs(**base, tp=tp, pp=pp, dp=dp, num_microbatches=GLOBAL_MICROBATCHES // dp, **kw)


def _name(family, tp, pp, dp, **kw):
    flags = "".join(f"-{k}={v}" for k, v in sorted(kw.items()))
    return f"{family}-tp{tp}pp{pp}dp{dp}{flags}"


SP_DISTOPT = {"sequence_parallel": True, "use_distributed_optimizer": True, "overlap_grad_reduce": True,
              "bucket_size": 1000}
# (family, tp, pp, dp, [variant kwargs]); each round's jobs use disjoint ranks, in order
ROUNDS = [
    [("llama", 1, 1, 1, [{}]), ("gpt2", 1, 1, 1, [{}]), ("llama", 2, 1, 1, [{}, {"sequence_parallel": True}]),
     ("llama", 1, 2, 1, [{}, {"vpp": 2}]), ("llama", 1, 1, 2, [{}, {"use_distributed_optimizer": True}])],
    [("llama", 2, 2, 2, [{}, SP_DISTOPT])],
    [("llama", 2, 2, 1, [{}, {"sequence_parallel": True}]),
     ("llama", 2, 1, 2, [{"sequence_parallel": True}, {"use_distributed_optimizer": True}])],
    [("gpt2", 2, 2, 1, [{"sequence_parallel": True}]), ("gpt2", 1, 2, 2, [{"use_distributed_optimizer": True}])],
]


def _train_jobs(rank, world_size):
    results = {}
    for r, jobs in enumerate(ROUNDS):
        start = 0
        for j, (family, tp, pp, dp, variants) in enumerate(jobs):
            size = tp * pp * dp
            if start <= rank < start + size:
                dist.init_process_group("gloo", store=dist.PrefixStore(f"round{r}job{j}", harness.store()),
                                        rank=rank - start, world_size=size, timeout=datetime.timedelta(seconds=120))
                try:
                    for kw in variants:
                        t0 = time.perf_counter()
                        results[_name(family, tp, pp, dp, **kw)] = pretrain(_args(family, tp, pp, dp, **kw))
                        results["time:" + _name(family, tp, pp, dp, **kw)] = time.perf_counter() - t0
                finally:
                    dist.destroy_process_group()
            start += size
    return results


@pytest.fixture(scope="module")
def curves():
    per_rank = run_ranks(_train_jobs, 8, backend=None, timeout=400)
    merged = {}
    print([{k: round(v, 2) for k, v in r.items() if k.startswith("time:")} for r in per_rank])
    for rank, res in enumerate(per_rank):
        for name, losses in res.items():
            merged.setdefault(name, []).append((rank, losses))
    return merged


def _reference(curves, family):
    (_, ref), = curves[_name(family, 1, 1, 1)]
    assert len(ref) == 5 and all(torch.isfinite(torch.tensor(ref)))
    assert ref[-1] < ref[0] - 0.05, f"the reference must be learning for parity to mean anything: {ref}"
    return ref


CASES = [(fam, tp, pp, dp, kw) for jobs in ROUNDS for fam, tp, pp, dp, vs in jobs for kw in vs if tp * pp * dp > 1]


@pytest.mark.world_size(8)
@pytest.mark.parametrize("family,tp,pp,dp,kw", CASES, ids=[_name(*c[:4], **c[4]) for c in CASES])
def test_loss_curve_matches_single_process(curves, family, tp, pp, dp, kw):
    ref = _reference(curves, family)
    runs = curves[_name(family, tp, pp, dp, **kw)]
    assert len(runs) == tp * pp * dp, "every rank of the layout reports the loss curve"
    for rank, losses in runs:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=2e-5, atol=2e-5,
                                   msg=lambda m, r=rank, lo=losses: f"rank {r}: {lo} vs single-process {ref}\n{m}")


@pytest.mark.world_size(8)
def test_interleaved_schedule_matches_1f1b(curves):
    (_, one_f_one_b), *_ = curves[_name("llama", 1, 2, 1)]
    (_, interleaved), *_ = curves[_name("llama", 1, 2, 1, vpp=2)]
    torch.testing.assert_close(torch.tensor(interleaved), torch.tensor(one_f_one_b), rtol=1e-5, atol=1e-5)


def test_bad_layout_raises_before_communication():
    with pytest.raises(ValueError, match=r"tp \(2\) x pp \(2\) x dp \(3\) = 12 does not match the world size \(8\)"):
        from mega_par.training import _check_args

        _check_args(dataclasses.replace(_args("llama", 2, 2, 2), dp=3), 8)
