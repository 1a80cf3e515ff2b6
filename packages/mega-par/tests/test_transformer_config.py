"""``TransformerConfig`` and ``ModelParallelConfig`` (``transformer_config.py``, ``model_parallel_config.py``).

Checks the fields Megatron-LM's ``examples/run_simple_mcore_train_loop.py`` and its ``tests/unit_tests``
set (``use_cpu_initialization``, ``pipeline_dtype``, ``params_dtype``, ``bf16``, ``sequence_parallel``,
``num_query_groups``, ``tensor_model_parallel_size``, ``embedding_init_method_std``, ...) against
``megatron/core/transformer/transformer_config.py`` / ``model_parallel_config.py``'s defaults and
``__post_init__`` errors; upstream ``tests/unit_tests/transformer/test_transformer_config.py`` tests only
MoE/MTP/fp8 fields mega_par does not have, so nothing is ported from it.
"""

import dataclasses
import re

import pytest
import torch
import torch.nn.functional as F
from mega_par.model_parallel_config import ModelParallelConfig
from mega_par.transformer.enums import AttnBackend
from mega_par.transformer.transformer_config import TransformerConfig

BASE = dict(num_layers=2, hidden_size=12, num_attention_heads=4)


def test_the_examples_fields_are_accepted_with_megatrons_defaults():
    c = TransformerConfig(**BASE, use_cpu_initialization=True, pipeline_dtype=torch.float32)
    assert c.use_cpu_initialization and c.pipeline_dtype is torch.float32
    # Megatron's defaults (transformer_config.py / model_parallel_config.py)
    assert (c.params_dtype, c.bf16, c.fp16, c.sequence_parallel) == (torch.float32, False, False, False)
    assert (c.num_query_groups, c.kv_channels, c.ffn_hidden_size) == (4, 3, 48)
    assert (c.hidden_dropout, c.attention_dropout, c.layernorm_epsilon) == (0.1, 0.1, 1e-5)
    assert (c.add_bias_linear, c.add_qkv_bias, c.gated_linear_unit, c.activation_func) == (True, False, False, F.gelu)
    assert (c.perform_initialization, c.finalize_model_grads_func, c.no_sync_func) == (True, None, None)
    assert (c.tensor_model_parallel_size, c.pipeline_model_parallel_size, c.attention_backend) == (1, 1,
                                                                                                    AttnBackend.auto)
    assert c.embedding_init_method is c.init_method and c.embedding_init_method_std == c.init_method_std
    assert isinstance(c, ModelParallelConfig)


def test_megatron_test_fields():
    c = TransformerConfig(**BASE, params_dtype=torch.bfloat16, bf16=True, tensor_model_parallel_size=2,
                          sequence_parallel=True, num_query_groups=2, pipeline_model_parallel_size=2,
                          pipeline_dtype=torch.bfloat16, bias_activation_fusion=True, bias_dropout_fusion=True,
                          masked_softmax_fusion=True, attention_backend=AttnBackend.local, kv_channels=8,
                          embedding_init_method_std=1.0, recompute_granularity="full", recompute_method="uniform",
                          recompute_num_layers=1)
    assert c.params_dtype is torch.bfloat16 and c.bf16 and c.num_query_groups == 2 and c.kv_channels == 8
    w = torch.empty(2000)
    c.embedding_init_method(w)
    assert 0.9 < w.std().item() < 1.1  # Megatron's test_gpt_model.py::test_embedding_init


def test_unknown_field_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="not_a_megatron_field"):
        TransformerConfig(**BASE, not_a_megatron_field=1)
    with pytest.raises(TypeError, match="use_cpu_init"):
        TransformerConfig(**BASE, use_cpu_init=True)  # a misspelling is not silently dropped


@pytest.mark.parametrize("kw, match", [
    (dict(fp16=True, bf16=True), "Only one of self.fp16"),
    (dict(sequence_parallel=True), "Cannot use sequence parallelism without tensor parallelism"),
    (dict(pipeline_model_parallel_size=2), "pipeline_dtype must be specified"),
    (dict(tensor_model_parallel_size=3), r"num_attention_heads \(4\) must be a multiple of tensor_model_parallel"),
    (dict(num_query_groups=1, tensor_model_parallel_size=2), r"num_query_groups \(1\) must be a multiple"),
    (dict(num_query_groups=3), r"must be divisible by num_query_groups \(3\)"),
    (dict(recompute_granularity="full"), 'recompute_method must be "block" or "uniform"'),
    (dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=3),
     "recompute_num_layers must be between 1 and num_layers_per_pipeline_rank: 2"),
    (dict(num_layers=0), "num_layers must be a positive int, got 0"),
])
def test_megatron_post_init_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**{**BASE, **kw})


@pytest.mark.parametrize("name, value", [
    ("num_moe_experts", 8), ("expert_model_parallel_size", 2), ("mtp_num_layers", 1), ("fp8", "hybrid"),
    ("multi_latent_attention", True), ("calculate_per_token_loss", True), ("window_size", (4, 0)),
    ("gradient_accumulation_fusion", True), ("tp_comm_overlap", True), ("batch_p2p_comm", False),
    ("attention_softmax_in_fp32", False), ("layernorm_zero_centered_gamma", True),
])
def test_megatron_fields_without_a_mechanism_are_refused_by_name(name, value):
    default = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}[name]
    TransformerConfig(**BASE, **{name: default})  # Megatron's default is accepted
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r} is not implemented in mega_par")):
        TransformerConfig(**BASE, **{name: value})


def test_attention_backend_other_than_local_is_refused():
    with pytest.raises(ValueError, match="attention_backend=<AttnBackend.flash: 1>"):
        TransformerConfig(**BASE, attention_backend=AttnBackend.flash)
