"""Megatron's module hierarchy: ``MegatronModule`` (``transformer/module.py``) under every model module,
``LanguageModule`` (``models/common/language_module/language_module.py``) under ``GPTModel``.

Ports Megatron's ``tests/unit_tests/transformer/test_module.py`` (TestMegatronModule, TestSetIsFirstMicrobatch,
TestFloat16Module incl. keep-in-fp32 parameters; on CPU, one rank of parallel_state per process). mega_par's own
cases: the class tree is Megatron's; ``sharded_state_dict`` built by the modules themselves (the block adding the
layer axis, the LanguageModule tying the output weight) gives each tensor's shard where Megatron puts it, at TP=2
and tied across PP=2 stages; ``compute_language_model_loss`` equals torch's cross-entropy; what needs machinery
mega_par does not have (symmetric-memory all-reduce, CUDA graphs, Transformer Engine's fused cross entropy) is
refused by name.
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

VOCAB, S, B = 100, 8, 2


def _config(**kw):
    from mega_par.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**{**dict(num_layers=2, hidden_size=12, num_attention_heads=4,
                                       use_cpu_initialization=True, pipeline_dtype=torch.float32), **kw})


def _dummy(config):
    from mega_par.transformer.module import MegatronModule

    class DummyModule(MegatronModule):
        def __init__(self, config):
            super().__init__(config)
            self.linear = torch.nn.Linear(in_features=2, out_features=1)

        def forward(self, x):
            return self.linear(x)

    return DummyModule(config)


def _gpt(config, **kw):
    from mega_par import parallel_state as ps
    from mega_par.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from mega_par.models.gpt.gpt_model import GPTModel

    kw.setdefault("pre_process", ps.is_pipeline_first_stage())
    kw.setdefault("post_process", ps.is_pipeline_last_stage())
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=S, seed=3, **kw)


def _upstream_module_tests(rank, world):
    """test_module.py: the module keeps its config and fp32; set_is_first_microbatch flags the child only under a
    quantized recipe; Float16Module casts to fp16 / bf16 (keep_in_fp32 tensors kept) and returns fp32."""
    from mega_par import parallel_state as ps
    from mega_par.tensor_parallel.random import model_parallel_cuda_manual_seed
    from mega_par.transformer.module import Float16Module, MegatronModule, mark_keep_in_fp32

    ps.initialize_model_parallel(1, 1)
    try:
        model_parallel_cuda_manual_seed(123)
        module = _dummy(_config())
        assert module.config.hidden_size == 12 and module.config.ffn_hidden_size == 48
        assert module.linear.weight.dtype == torch.float32
        assert module(torch.ones(2, 2)).dtype == torch.float32

        class Flagged(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.is_first_microbatch = False

        for recipe, flagged in ((None, False), (object(), True)):
            config = _config()
            config.quant_recipe = recipe
            quant = MegatronModule(config)
            quant.child = Flagged()
            quant.set_is_first_microbatch()
            assert quant.child.is_first_microbatch is flagged, recipe

        for precision, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            config = _config(**{precision: True})
            inner = _dummy(config)
            inner.fp32_param = mark_keep_in_fp32(torch.nn.Parameter(torch.zeros(4)))
            wrapped = Float16Module(config=config, module=inner)
            assert wrapped.config.hidden_size == 12
            assert wrapped.module.linear.weight.dtype == dtype
            assert wrapped.module.fp32_param.dtype == torch.float32
            assert wrapped(torch.ones(2, 2)).dtype == torch.float32  # inputs cast down, the output back up
            assert wrapped(torch.ones(2, 2), fp32_output=False).dtype == dtype
            assert wrapped.state_dict().keys() == inner.state_dict().keys()
        with pytest.raises(ValueError, match="either config.fp16 or config.bf16"):
            Float16Module(config=_config(), module=_dummy(_config()))
    finally:
        ps.destroy_model_parallel()


def _class_tree(rank, world):
    """Megatron's tree; the embedding and output weights marked; the loss is torch's cross-entropy per token."""
    from mega_par import parallel_state as ps
    from mega_par.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
    from mega_par.models.common.language_module.language_module import LanguageModule
    from mega_par.transformer.attention import SelfAttention
    from mega_par.transformer.dot_product_attention import DotProductAttention
    from mega_par.transformer.mlp import MLP
    from mega_par.transformer.module import GraphableMegatronModule, MegatronModule
    from mega_par.transformer.transformer_block import TransformerBlock
    from mega_par.transformer.transformer_layer import TransformerLayer

    ps.initialize_model_parallel(1, 1)
    try:
        model = _gpt(_config(hidden_dropout=0.0, attention_dropout=0.0))
        assert isinstance(model, LanguageModule) and isinstance(model, MegatronModule)
        layer = model.decoder.layers[0]
        for module, cls in ((model.decoder, TransformerBlock), (layer, GraphableMegatronModule),
                            (layer.self_attention, SelfAttention), (layer.self_attention.core_attention,
                                                                    DotProductAttention),
                            (layer.mlp, MLP), (model.embedding, LanguageModelEmbedding)):
            assert isinstance(module, cls) and isinstance(module, MegatronModule), type(module)
            assert module.config is model.config
        assert isinstance(layer, TransformerLayer)
        assert model.tp_group is ps.get_tensor_model_parallel_group()
        assert model.pp_group is ps.get_pipeline_model_parallel_group()
        assert model.embedding.word_embeddings.weight.is_embedding_or_output_parameter
        assert model.output_layer.weight.is_embedding_or_output_parameter
        assert not hasattr(layer.mlp.linear_fc1.weight, "is_embedding_or_output_parameter")
        ids = torch.randint(0, VOCAB, (B, S), generator=torch.Generator().manual_seed(0))
        labels = ids.roll(-1, 1)
        with torch.no_grad():
            logits = model(ids, None, None)
            loss = model(ids, None, None, labels=labels)
            direct = model.compute_language_model_loss(labels, logits.transpose(0, 1).contiguous())
        want = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none").view(B, S)
        torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(direct, want, rtol=1e-5, atol=1e-6)
        assert model.state_dict_for_save_checkpoint().keys() == model.state_dict().keys()
    finally:
        ps.destroy_model_parallel()


def _sharded_state_dict_tp2(rank, world):
    """Every state-dict tensor once; TP-split ones chunk ``rank`` of 2 along their partition dim, the layers on a
    prepended ``num_layers`` axis under ``decoder.layers.``, replicated ones main on TP rank 0; the default of
    ``MegatronModule`` for a module of the user's own the same way."""
    from mega_par import parallel_state as ps
    from mega_par.dist_checkpointing.mapping import ShardedTensor
    from mega_par.tensor_parallel.layers import ColumnParallelLinear
    from mega_par.transformer.module import MegatronModule

    ps.initialize_model_parallel(2, 1)
    try:
        config = _config(tensor_model_parallel_size=2)
        model = _gpt(config)
        sd = model.sharded_state_dict()
        assert sd.keys() == model.state_dict().keys()
        qkv = sd["decoder.layers.1.self_attention.linear_qkv.weight"]
        assert isinstance(qkv, ShardedTensor) and qkv.key == "decoder.layers.self_attention.linear_qkv.weight"
        assert (qkv.global_shape, qkv.global_offset, qkv.replica_id) == ((2, 36, 12), (1, 18 * rank, 0), (0, 0, 0))
        proj = sd["decoder.layers.0.self_attention.linear_proj.weight"]
        assert (proj.global_shape, proj.global_offset) == ((2, 12, 12), (0, 0, 6 * rank))
        norm = sd["decoder.final_layernorm.weight"]
        assert (norm.key, norm.global_shape, norm.replica_id) == ("decoder.final_layernorm.weight", (12,), (0, rank, 0))
        out = sd["output_layer.weight"]
        assert (out.global_shape, out.global_offset, out.allow_shape_mismatch) == ((100, 12), (50 * rank, 0), True)
        emb = sd["embedding.word_embeddings.weight"]
        assert (emb.global_offset, emb.allow_shape_mismatch) == ((50 * rank, 0), False)

        class Mine(MegatronModule):
            def __init__(self):
                super().__init__(config)
                self.col = ColumnParallelLinear(12, 8, config=config, init_method=config.init_method, bias=True,
                                                gather_output=False)
                self.plain = torch.nn.Linear(3, 3)
                self.scale = torch.nn.Parameter(torch.ones(3))

        mine = Mine().sharded_state_dict(prefix="m.")
        assert mine.keys() == {"m.col.weight", "m.col.bias", "m.plain.weight", "m.plain.bias", "m.scale"}
        assert (mine["m.col.weight"].global_shape, mine["m.col.weight"].global_offset) == ((8, 12), (4 * rank, 0))
        assert mine["m.plain.weight"].replica_id == mine["m.scale"].replica_id == (0, rank, 0)
        with pytest.raises(ValueError, match="unexpected sharded_offsets"):
            model.sharded_state_dict(sharded_offsets=((0, 0, 1),))
    finally:
        ps.destroy_model_parallel()


def _tied_across_stages(rank, world):
    """Tied at PP=2: the last stage's copy starts equal to the embedding and is marked ``shared``; its
    checkpoint entry is a non-main replica of the first stage's ``embedding.word_embeddings.weight``."""
    from mega_par import parallel_state as ps

    ps.initialize_model_parallel(1, 2)
    try:
        model = _gpt(_config(pipeline_model_parallel_size=2), share_embeddings_and_output_weights=True)
        weight = model.shared_embedding_or_output_weight()
        first = weight.detach().clone()
        dist.broadcast(first, src=0)
        assert torch.equal(weight, first) and weight.shared_embedding
        sd = model.sharded_state_dict()
        if rank == 0:
            assert "output_layer.weight" not in sd and not getattr(weight, "shared", False)
            assert sd["embedding.word_embeddings.weight"].replica_id == (0, 0, 0)
        else:
            assert weight.shared and "embedding.word_embeddings.weight" not in sd
            tied = sd["output_layer.weight"]
            assert (tied.key, tied.replica_id, tied.allow_shape_mismatch) == (
                "embedding.word_embeddings.weight", (1, 0, 0), True)
            assert tied.data is model.output_layer.weight
    finally:
        ps.destroy_model_parallel()


def _refused_by_name(rank, world):
    from mega_par import parallel_state as ps
    from mega_par.models.common.language_module.language_module import LanguageModule
    from mega_par.transformer.module import GraphableMegatronModule

    ps.initialize_model_parallel(1, 1)
    try:
        model = _gpt(_config())
        model.set_symmetric_ar(None)
        with pytest.raises(NotImplementedError, match="symmetric-memory all-reduce"):
            model.set_symmetric_ar("two_shot")
        with pytest.raises(ValueError, match="set_to must be one of"):
            model.set_symmetric_ar("three_shot")
        config = _config(cross_entropy_loss_fusion=True)
        config.cross_entropy_fusion_impl = "te"
        te = _gpt(config)
        with pytest.raises(NotImplementedError, match="Transformer Engine"):
            te(torch.zeros(B, S, dtype=torch.long), None, None, labels=torch.zeros(B, S, dtype=torch.long))
        config = _config()
        config.cuda_graph_impl = "local"
        with pytest.raises(NotImplementedError, match="cuda_graph_impl='local'"):
            GraphableMegatronModule(config)

        class OnlyTP:
            tp = ps.get_tensor_model_parallel_group()

        with pytest.raises(ValueError, match=r"lacks the groups \['pp', 'cp', 'embd'\]"):
            LanguageModule(_config(), pg_collection=OnlyTP())
    finally:
        ps.destroy_model_parallel()


CASES = {"upstream_test_module": _upstream_module_tests, "class_tree": _class_tree,
         "sharded_state_dict_tp2": _sharded_state_dict_tp2, "tied_across_stages": _tied_across_stages,
         "refused_by_name": _refused_by_name}


def _rank_main(rank, world):
    return H.run_cases({name: (lambda f=f: f(rank, world)) for name, f in CASES.items()})


@pytest.fixture(scope="module")
def results():
    return harness.run_ranks(_rank_main, 2, backend="gloo", timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_module_case(results, case):
    H.assert_case(results, case)
