"""``GPTModel`` built from ``get_gpt_layer_local_spec`` and trained through ``get_forward_backward_func`` with
the arguments of Megatron-LM's ``examples/run_simple_mcore_train_loop.py`` (``models/gpt/``, ``transformer/``,
``pipeline_parallel/schedules.py``).

Ports from Megatron's ``tests/unit_tests/models/test_gpt_model.py``: test_constructor (6240 parameters for
2 layers x hidden 12 x 4 heads, vocab 100, 4 positions; upstream builds the TE spec, whose fused layer norms
hold the same parameters as the local spec's), test_set_input_tensor, test_post_process_forward (an all-True
boolean mask of shape [b, 1, s, s]); from ``tests/unit_tests/transformer/test_spec_customization.py``:
SelfAttention built from its spec keeps ``layer_number`` and ``attn_mask_type`` (624 parameters with the
local linears). The rest is mega_par's own, each against what Megatron's code does: a causal
``attention_mask`` gives the implicit mask's logits exactly and a document mask the per-document logits
(``dot_product_attention.py`` / ``fused_softmax.py``: a given mask replaces the causal one); labels give the
per-token loss [b, s] (``LanguageModule.compute_language_model_loss``); tied weights are one parameter on one
stage and equal copies across two; the schedules call ``finalize_model_grads_func`` only when the config names
it, so the example's own ``finalize_model_grads([model])`` is the only sync; and at TP=2 and PP=2 on two gloo
ranks every gradient equals the unsharded model's. Torch's defaults give Megatron's parameter names, so
``state_dict`` keys are the local spec's.
"""

import importlib.util
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import harness

_spec = importlib.util.spec_from_file_location("mega_par_test_helpers", pathlib.Path(__file__).with_name("_helpers.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

VOCAB, S, B = 100, 16, 4

# Megatron's local-spec parameter names for one layer (megatron/core/models/gpt/gpt_layer_specs.py:
# get_gpt_layer_local_spec -> TransformerLayer with SelfAttention(linear_qkv, linear_proj), MLP(linear_fc1,
# linear_fc2), torch norms), shapes for hidden 12, 4 heads, ffn 48
LAYER_PARAMS = {
    "input_layernorm.weight": (12,), "input_layernorm.bias": (12,),
    "self_attention.linear_qkv.weight": (36, 12), "self_attention.linear_qkv.bias": (36,),
    "self_attention.linear_proj.weight": (12, 12), "self_attention.linear_proj.bias": (12,),
    "pre_mlp_layernorm.weight": (12,), "pre_mlp_layernorm.bias": (12,),
    "mlp.linear_fc1.weight": (48, 12), "mlp.linear_fc1.bias": (48,),
    "mlp.linear_fc2.weight": (12, 48), "mlp.linear_fc2.bias": (12,),
}


def _config(**kw):
    from mega_par.transformer.transformer_config import TransformerConfig

    base = dict(num_layers=2, hidden_size=12, num_attention_heads=4, use_cpu_initialization=True,
                pipeline_dtype=torch.float32)
    return TransformerConfig(**{**base, **kw})


def _model(config, **kw):
    from mega_par import parallel_state as ps
    from mega_par.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from mega_par.models.gpt.gpt_model import GPTModel

    kw.setdefault("pre_process", ps.is_pipeline_first_stage())
    kw.setdefault("post_process", ps.is_pipeline_last_stage())
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=kw.pop("max_sequence_length", S), **kw)


def _causal(b, s):
    return torch.triu(torch.ones(b, 1, s, s, dtype=torch.bool), diagonal=1)  # True = masked out (GPTDataset)


def _batches(n):
    """Micro-batches as Megatron's GPTDataset hands them over (attention_mask [b, 1, s, s], loss_mask)."""
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        text = torch.randint(0, VOCAB, (B, S + 1), generator=g)
        loss_mask = (torch.rand(B, S, generator=g) > 0.2).float()
        out.append({"tokens": text[:, :-1], "labels": text[:, 1:], "loss_mask": loss_mask,
                    "attention_mask": _causal(B, S), "position_ids": torch.arange(S).repeat(B, 1)})
    return out


def forward_step_func(data_iterator, model):
    """The example's forward_step_func, device lines dropped."""
    def loss_func(loss_mask, output_tensor):
        losses = output_tensor.float()
        loss_mask = loss_mask.view(-1).float()
        loss = torch.sum(losses.view(-1) * loss_mask) / loss_mask.sum()
        return loss, {"lm loss": loss}

    data = next(data_iterator)
    output_tensor = model(data["tokens"], data["position_ids"], data["attention_mask"], labels=data["labels"])
    return output_tensor, lambda out: loss_func(data["loss_mask"], out)


def _reference(n, seed, **model_kw):
    """The unsharded model's mean loss over n micro-batches and every parameter's gradient."""
    from mega_par import parallel_state as ps

    ps.initialize_model_parallel(1, 1)
    try:
        model = _model(_config(hidden_dropout=0.0, attention_dropout=0.0), seed=seed, **model_kw)
        it, total = iter(_batches(n)), 0.0
        for _ in range(n):
            out, loss_func = forward_step_func(it, model)
            loss = loss_func(out)[0] / n
            loss.backward()
            total += loss.item()
        return total, {k: p.grad.clone() for k, p in model.named_parameters()}
    finally:
        ps.destroy_model_parallel()


def _full_grad(p):
    """The gradient of the whole parameter: TP shards gathered along their partition dim (stride 1 here)."""
    from mega_par import parallel_state as ps

    g = p.main_grad
    if not getattr(p, "tensor_model_parallel", False) or ps.get_tensor_model_parallel_world_size() == 1:
        return g
    parts = [torch.empty_like(g) for _ in range(ps.get_tensor_model_parallel_world_size())]
    dist.all_gather(parts, g.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=p.partition_dim)


def _train_step(tp, pp, seed, n=2, **model_kw):
    """The example's step: DDP-wrapped model, get_forward_backward_func() with its keyword arguments, then
    finalize_model_grads([model]) by the caller. Returns (losses_reduced, {name: full grad}, ddp)."""
    from mega_par import parallel_state as ps
    from mega_par.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from mega_par.distributed.finalize_model_grads import finalize_model_grads
    from mega_par.pipeline_parallel.schedules import get_forward_backward_func

    config = _config(hidden_dropout=0.0, attention_dropout=0.0, tensor_model_parallel_size=tp,
                     pipeline_model_parallel_size=pp)
    model = _model(config, seed=seed, **model_kw)
    ddp = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, overlap_grad_reduce=False, use_distributed_optimizer=False), module=model)
    losses = get_forward_backward_func()(forward_step_func=forward_step_func, data_iterator=iter(_batches(n)),
                                         model=ddp, num_microbatches=n, seq_length=S, micro_batch_size=B,
                                         decoder_seq_length=S, forward_only=False)
    finalize_model_grads([ddp])
    offset = ps.get_pipeline_model_parallel_rank() * (config.num_layers // pp)
    grads = {}
    for name, p in model.named_parameters():
        if name.startswith("decoder.layers."):  # local layer index -> the whole model's
            i, rest = name[len("decoder.layers."):].split(".", 1)
            name = f"decoder.layers.{int(i) + offset}.{rest}"
        grads[name] = _full_grad(p)
    return losses, grads, ddp


def _assert_grads_match(grads, ref):
    assert grads, "no gradients compared"
    for name, g in grads.items():
        torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def _constructor(rank, world):
    """Megatron's test_gpt_model.py setup (TP=1 x PP=1) and test_spec_customization's SelfAttention."""
    from mega_par import parallel_state as ps
    from mega_par.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from mega_par.tensor_parallel.random import model_parallel_cuda_manual_seed
    from mega_par.transformer.attention import SelfAttention
    from mega_par.transformer.enums import AttnMaskType
    from mega_par.transformer.spec_utils import build_module

    ps.initialize_model_parallel(1, 1)
    try:
        model_parallel_cuda_manual_seed(123)
        model = _model(_config(embedding_init_method_std=1.0), max_sequence_length=4)
        assert model.max_sequence_length == 4
        assert sum(p.numel() for p in model.parameters()) == 6240
        assert 0.9 < model.embedding.word_embeddings.weight.std().item() < 1.1  # test_embedding_init
        want = {"embedding.word_embeddings.weight": (100, 12), "embedding.position_embeddings.weight": (4, 12),
                **{f"decoder.layers.{i}.{k}": v for i in range(2) for k, v in LAYER_PARAMS.items()},
                "decoder.final_layernorm.weight": (12,), "decoder.final_layernorm.bias": (12,),
                "output_layer.weight": (100, 12)}
        assert {k: tuple(p.shape) for k, p in model.named_parameters()} == want
        model.set_input_tensor(torch.ones(4, 2, 12))
        assert model.decoder.input_tensor.shape == (4, 2, 12)
        model.set_input_tensor(None)
        ids = torch.arange(4).repeat(2, 1)
        logits = model.forward(input_ids=ids, position_ids=ids, attention_mask=torch.ones(2, 1, 4, 4, dtype=bool))
        assert logits.shape == (2, 4, 100)
        attn_spec = get_gpt_layer_local_spec().submodules.self_attention
        attn = build_module(attn_spec, config=model.config, layer_number=1)
        assert isinstance(attn, SelfAttention) and attn.layer_number == 1
        assert attn.attn_mask_type == attn_spec.params["attn_mask_type"] == AttnMaskType.causal
        assert sum(p.numel() for p in attn.parameters()) == 624
        for bad, match in ((dict(num_experts=4), "num_experts=4"), (dict(multi_latent_attention=True),
                                                                    "multi_latent_attention=True")):
            with pytest.raises(ValueError, match=match):
                get_gpt_layer_local_spec(**bad)
        rms = _model(_config(normalization="RMSNorm"), seed=1)
        assert isinstance(rms.decoder.layers[0].input_layernorm, torch.nn.RMSNorm)
        assert "decoder.layers.0.input_layernorm.bias" not in dict(rms.named_parameters())
    finally:
        ps.destroy_model_parallel()


def _attention_mask(rank, world):
    """A causal mask gives the implicit mask's logits exactly; a two-document mask gives each document's
    tokens the logits of that document alone; a float mask is refused."""
    from mega_par import parallel_state as ps

    ps.initialize_model_parallel(1, 1)
    try:
        model = _model(_config(), seed=4).eval()
        data = _batches(1)[0]
        ids, pos = data["tokens"], data["position_ids"]
        with torch.no_grad():
            implicit = model(ids, pos, None)
            given = model(ids, pos, _causal(B, S))
            assert torch.equal(implicit, given)
            k = 6
            docs = _causal(B, S).clone()
            docs[:, :, k:, :k] = True  # tokens of the second document do not see the first
            split = model(ids, pos, docs)
            alone = model(ids[:, k:], pos[:, k:], None)
            torch.testing.assert_close(split[:, k:], alone, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(split[:, :k], implicit[:, :k], rtol=0, atol=0)
            assert not torch.allclose(split[:, k:], implicit[:, k:], atol=1e-3), "the mask must change the logits"
        with pytest.raises(TypeError, match="attention_mask must be boolean"):
            model(ids, pos, _causal(B, S).float())
    finally:
        ps.destroy_model_parallel()


def _labels_give_per_token_loss(rank, world):
    from mega_par import parallel_state as ps

    ps.initialize_model_parallel(1, 1)
    try:
        model = _model(_config(), seed=5).eval()
        data = _batches(1)[0]
        with torch.no_grad():
            logits = model(data["tokens"], data["position_ids"], data["attention_mask"])
            loss = model(data["tokens"], data["position_ids"], data["attention_mask"], labels=data["labels"])
        assert loss.shape == (B, S)
        want = F.cross_entropy(logits.reshape(-1, VOCAB), data["labels"].reshape(-1), reduction="none")
        torch.testing.assert_close(loss, want.view(B, S), rtol=1e-5, atol=1e-6)
    finally:
        ps.destroy_model_parallel()


def _tied_one_stage(rank, world):
    """Tied: no output weight of its own, the logits of an untied model whose output weight is the embedding."""
    from mega_par import parallel_state as ps

    ps.initialize_model_parallel(1, 1)
    try:
        tied = _model(_config(), seed=6, share_embeddings_and_output_weights=True).eval()
        untied = _model(_config(), seed=6).eval()
        assert tied.output_layer.weight is None
        assert tied.shared_embedding_or_output_weight() is tied.embedding.word_embeddings.weight
        n_tied, n_untied = (sum(p.numel() for p in m.parameters()) for m in (tied, untied))
        assert n_untied - n_tied == VOCAB * 12
        with torch.no_grad():
            untied.output_layer.weight.copy_(untied.embedding.word_embeddings.weight)
        data = _batches(1)[0]
        with torch.no_grad():
            args = (data["tokens"], data["position_ids"], data["attention_mask"])
            torch.testing.assert_close(tied(*args), untied(*args), rtol=0, atol=0)
    finally:
        ps.destroy_model_parallel()


def _tp2_forward_backward_func(rank, world):
    from mega_par import parallel_state as ps

    ref_loss, ref = _reference(2, seed=11)
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=1)
    try:
        losses, grads, _ = _train_step(2, 1, seed=11)
        assert len(losses) == 2
        torch.testing.assert_close(sum(d["lm loss"].item() for d in losses) / 2, ref_loss, rtol=1e-5, atol=1e-6)
        assert grads.keys() == ref.keys()
        _assert_grads_match(grads, ref)
    finally:
        ps.destroy_model_parallel()


def _pp2_forward_backward_func(rank, world):
    """1F1B over 2 stages, untied and tied; tied, the last stage's copy equals the first stage's embedding
    after construction, and re-tying after the copy is spoilt restores it (Megatron's
    setup_embeddings_and_output_layer: the copy is zeroed and summed with the embedding over the embedding group)."""
    from mega_par import parallel_state as ps

    for tied in (False, True):
        ref_loss, ref = _reference(2, seed=12, share_embeddings_and_output_weights=tied)
        ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=2)
        try:
            losses, grads, ddp = _train_step(1, 2, seed=12, share_embeddings_and_output_weights=tied)
            if ps.is_pipeline_last_stage():
                assert len(losses) == 2
                torch.testing.assert_close(sum(d["lm loss"].item() for d in losses) / 2, ref_loss, rtol=1e-5,
                                           atol=1e-6)
            else:
                assert losses == []
            if tied and rank == 1:  # the last stage's copy holds the gradient of the one tied weight
                grads["embedding.word_embeddings.weight"] = grads.pop("output_layer.weight")
            assert all(name in ref for name in grads)
            _assert_grads_match(grads, ref)
            if tied:
                w = ddp.module.shared_embedding_or_output_weight().detach().clone()
                other = w.clone()
                dist.broadcast(other, src=0)
                assert torch.equal(w, other), "tied copies differ across stages"
                if rank == 1:
                    with torch.no_grad():
                        ddp.module.output_layer.weight.normal_()
                ddp.module.setup_embeddings_and_output_layer()
                assert torch.equal(ddp.module.shared_embedding_or_output_weight(), other)
        finally:
            ps.destroy_model_parallel()


def _p2p_shape_mismatch(rank, world):
    """The upstream example's model_provider builds pre_process=post_process=True on every stage, so at PP=2
    stage 0 would send its loss [b, s] where stage 1 waits for [s, b, h]: refused before any message."""
    from mega_par import parallel_state as ps
    from mega_par.pipeline_parallel import p2p_communication as p2p

    ps.initialize_model_parallel(1, 2)
    try:
        if rank == 0:
            with pytest.raises(ValueError, match=r"has shape \(4, 16\), the schedule exchanges \(16, 4, 12\)"):
                p2p.send_forward(torch.zeros(B, S), (S, B, 12))
    finally:
        ps.destroy_model_parallel()


def _finalize_hook(rank, world):
    """Megatron's schedules call config.finalize_model_grads_func when set (not in forward_only), else nothing."""
    from mega_par import parallel_state as ps
    from mega_par.pipeline_parallel.schedules import get_forward_backward_func

    ps.initialize_model_parallel(2, 1)
    try:
        calls = []
        config = _config(tensor_model_parallel_size=2, finalize_model_grads_func=lambda chunks, *a: calls.append(
            len(chunks)))
        model = _model(config, seed=13)
        kw = dict(forward_step_func=forward_step_func, model=model, num_microbatches=2, seq_length=S,
                  micro_batch_size=B, decoder_seq_length=S)
        get_forward_backward_func()(data_iterator=iter(_batches(2)), forward_only=False, **kw)
        get_forward_backward_func()(data_iterator=iter(_batches(2)), forward_only=True, **kw)
        assert calls == [1]
        with pytest.raises(ValueError, match="decoder_seq_length must be a positive int or None, got 0"):
            get_forward_backward_func()(data_iterator=iter(_batches(2)), forward_only=True,
                                        **{**kw, "decoder_seq_length": 0})
    finally:
        ps.destroy_model_parallel()


CASES = {"constructor": _constructor, "attention_mask": _attention_mask, "labels": _labels_give_per_token_loss,
         "tied_one_stage": _tied_one_stage, "tp2_forward_backward_func": _tp2_forward_backward_func,
         "pp2_forward_backward_func": _pp2_forward_backward_func, "p2p_shape_mismatch": _p2p_shape_mismatch,
         "finalize_hook": _finalize_hook}


def _rank_main(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.fixture(scope="module")
def results():
    return harness.run_ranks(_rank_main, 2, backend="gloo", timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_gpt_model_case(results, case):
    H.assert_case(results, case)
