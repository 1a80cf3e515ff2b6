"""Gradient-level parity: after one step of every 3D layout, each parameter's gradient, gathered to its full
shape, equals the single-process model's within fp32 tolerance.

Loss curves hide gradient errors (Adam normalises a uniformly rescaled gradient away: a 2x position-embedding
gradient trained the same curve), so this compares the gradients themselves: TP shards concatenated by each
parameter's partition dim and stride, PP stages by layer number, the distributed optimizer's reduce-scattered
DP shards all-gathered, for the GPT-2-style model (learned positions, LayerNorm, biases, tied embeddings) and the
Llama-style one (RoPE, RMSNorm, GQA, SwiGLU), each with and without the distributed optimizer. Replicated
parameters must also agree over the TP group. The gradients are computed inside the package's shared 8-rank run
(test_gpt_3d._rank_jobs calls ``layout_grads`` in every job); the reference is the (1, 1, 1) run of each family.
"""

import dataclasses
import importlib.util
import pathlib

import pytest
import torch
import torch.distributed as dist
from mega_par import parallel_state as ps
from mega_par.checkpointing import merge_shards
from mega_par.training import pretrain


def _sibling(stem):
    spec = importlib.util.spec_from_file_location(
        f"mega_par_tests_{stem}", pathlib.Path(__file__).with_name(f"{stem}.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


G = _sibling("test_gpt_3d")
FAMILIES = ("llama", "gpt2")


def _full_bucket_grads(chunk) -> dict:
    """param -> its averaged gradient; the distributed optimizer left only this DP rank's shard of each bucket
    reduced, so the shards are all-gathered first (collective over the DP group)."""
    out, buf = {}, chunk.buffer
    for bucket in buf.buckets:
        grads = bucket.grad_data
        if chunk.ddp_config.use_distributed_optimizer and bucket.data_parallel_world_size > 1:
            start, end = bucket.shard_range(dist.get_rank(bucket.data_parallel_group))
            grads = torch.empty_like(bucket.grad_data)
            dist.all_gather_into_tensor(
                grads, bucket.grad_data[start:end].contiguous(), group=bucket.data_parallel_group
            )
        for p in bucket.params:
            lo, hi = (i - bucket.offset for i in buf.param_index_map[p])
            out[p] = grads[lo:hi].view_as(p).clone()
    return out


def one_step_grads(args) -> dict:
    """This rank's gradients after one training step of ``args``, as a checkpoint-style shard."""
    _, chunks = pretrain(dataclasses.replace(args, train_iters=1, save=None, load=None), return_model=True)
    shard = {
        "tp_size": ps.get_tensor_model_parallel_world_size(),
        "pp_size": ps.get_pipeline_model_parallel_world_size(),
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "dp_rank": ps.get_data_parallel_rank(),
    }
    for i, chunk in enumerate(chunks):
        grads, inner = _full_bucket_grads(chunk), chunk.module
        key = "model" if len(chunks) == 1 else f"model{i}"
        shard[key] = {n: grads[p] for n, p in inner.named_parameters()}
        shard[f"{key}_tp_meta"] = {
            n: (p.partition_dim, p.partition_stride)
            for n, p in inner.named_parameters()
            if getattr(p, "tensor_model_parallel", False)
        }
        shard[f"{key}_layer_numbers"] = [layer.layer_number for layer in inner.decoder.layers]
    return shard


def grad_variants(tp, pp, dp, variants):
    """The gradient cases of one loss-parity job: its layouts (the distributed-optimizer flag set aside), each
    for both families, without and with the distributed optimizer."""
    layouts = []
    for kw in variants:
        kw = {k: v for k, v in kw.items() if k != "use_distributed_optimizer"}
        if kw not in layouts:
            layouts.append(kw)
    return [(fam, dict(kw, use_distributed_optimizer=d)) for kw in layouts for fam in FAMILIES for d in (False, True)]


def layout_grads(family, tp, pp, dp, variants) -> dict:
    """Run inside a job's world: the grads of every case of ``grad_variants`` (or the reference at (1, 1, 1))."""
    out = {}
    cases = grad_variants(tp, pp, dp, variants) if tp * pp * dp > 1 else [(family, {})]
    for fam, kw in cases:
        ps.initialize_model_parallel(tp, pp, kw.get("vpp"))  # kept alive past pretrain: the shard needs its ranks
        try:
            out[f"grads:{G._name(fam, tp, pp, dp, **kw)}"] = one_step_grads(G._args(fam, tp, pp, dp, **kw))
        finally:
            ps.destroy_model_parallel()
    return out


CASES = [
    (fam, tp, pp, dp, kw)
    for jobs in G.ROUNDS
    for f, tp, pp, dp, vs in jobs
    if f in FAMILIES and tp * pp * dp > 1
    for fam, kw in grad_variants(tp, pp, dp, vs)
]


@pytest.fixture(scope="module")
def shards(mega_par_ranks):
    out = {}
    for res in mega_par_ranks["per_rank"]:
        for name, value in res.items():
            if name.startswith("grads:"):
                out.setdefault(name[len("grads:") :], []).append(value)
    return out


def _reference(shards, family):
    (ref,) = shards[G._name(family, 1, 1, 1)]
    full = merge_shards({(0, 0): ref})
    assert all(g.abs().sum() > 0 for g in full.values()), "every reference gradient is non-zero"
    return full


@pytest.mark.world_size(8)
@pytest.mark.parametrize("family,tp,pp,dp,kw", CASES, ids=[G._name(*c[:4], **c[4]) for c in CASES])
def test_every_gradient_matches_the_unsharded_model(shards, family, tp, pp, dp, kw):
    ref = _reference(shards, family)
    ranks = shards[G._name(family, tp, pp, dp, **kw)]
    assert len(ranks) == tp * pp * dp, "every rank reports its gradients"
    for d in range(dp):
        by_rank = {(s["tp_rank"], s["pp_rank"]): s for s in ranks if s["dp_rank"] == d}
        for s in by_rank.values():  # replicated parameters: every TP rank holds the same gradient
            twin = by_rank[(0, s["pp_rank"])]
            for key in (k for k in s if k.startswith("model") and not k.endswith(("_meta", "_numbers"))):
                for name, g in s[key].items():
                    if name not in s[f"{key}_tp_meta"]:
                        torch.testing.assert_close(g, twin[key][name], rtol=0, atol=0, msg=f"{name} over TP")
        full = merge_shards(by_rank)
        tied = "output_layer.weight" not in ref and "output_layer.weight" in full  # last stage's tied copy
        names = set(full) - ({"output_layer.weight"} if tied else set())
        assert names == set(ref), f"dp rank {d}: parameters {sorted(names ^ set(ref))} differ"
        for name, g in full.items():
            want = ref["embedding.word_embeddings.weight" if tied and name == "output_layer.weight" else name]
            # relative to the tensor's scale: a 2x error on a small gradient must not hide under atol
            torch.testing.assert_close(
                g,
                want,
                rtol=1e-4,
                atol=1e-5 * want.abs().max().item(),
                msg=lambda m, n=name, dr=d: f"dp rank {dr}, {n}: {m}",
            )
