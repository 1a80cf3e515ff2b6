"""Llama: GQA, RoPE (theta, linear and llama3 scaling), RMSNorm, SwiGLU, cache; equal to transformers."""

import pytest
import torch
import transformers
from hf_lite import LlamaConfig, LlamaForCausalLM
from hf_lite_testing import make_model, tiny_llama_config

ROPES = [
    {"rope_type": "linear", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"])
def test_llama_rope_scaling_matches_transformers(rope, tmp_path):
    ours = make_model("llama", rope_scaling=dict(rope), num_key_value_heads=1, tie_word_embeddings=True)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert theirs.config.rope_parameters["rope_type"] == rope["rope_type"]
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    # the scaling matters: plain RoPE gives different logits at long positions
    plain = LlamaForCausalLM(tiny_llama_config(num_key_value_heads=1, tie_word_embeddings=True)).eval()
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert not torch.allclose(plain(input_ids=ids).logits, theirs(input_ids=ids).logits, atol=1e-4)


def test_llama_config_accepts_legacy_rope_keys_and_transformers_reads_ours(tmp_path):
    cfg = tiny_llama_config(rope_theta=1234.0, rope_scaling={"type": "linear", "factor": 3.0})
    assert cfg.rope_parameters == {"rope_type": "linear", "factor": 3.0, "rope_theta": 1234.0}
    assert cfg.rope_theta == 1234.0
    cfg.save_pretrained(tmp_path)
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert theirs.rope_parameters["rope_theta"] == 1234.0 and theirs.rope_parameters["factor"] == 3.0
    assert theirs.num_key_value_heads == 2 and theirs.head_dim == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_attention_heads=4, num_key_value_heads=3), "multiple of num_key_value_heads"),
        (dict(rope_scaling={"rope_type": "yarnish", "factor": 2.0}), "not supported"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 2.0}), "low_freq_factor"),
        (dict(hidden_size=0), "hidden_size"),
    ],
)
def test_llama_config_rejects_invalid_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny_llama_config(**kwargs)


def test_llama_gqa_cache_keeps_compact_kv_heads():
    model = make_model("llama")
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
        nxt = model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
    k, v = nxt.past_key_values[0]
    assert k.shape == (2, 2, 8, 8) and v.shape == (2, 2, 8, 8)  # 2 kv heads, not 4 query heads
    # legacy tuple caches are accepted too
    legacy = out.past_key_values.to_legacy_cache()
    assert isinstance(LlamaConfig, type) and len(legacy) == 2


def test_llama_chunked_prefill_with_cache_equals_full_forward():
    """A multi-token chunk after a cached past needs a bottom-right aligned causal mask."""
    model = make_model("llama")
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        first = model(input_ids=ids[:, :5], use_cache=True)
        second = model(input_ids=ids[:, 5:], past_key_values=first.past_key_values, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), full, rtol=1e-5, atol=1e-5)


def test_bf16_loading_keeps_the_rope_table_fp32_like_transformers(tmp_path):
    """inv_freq is a non-persistent fp32 buffer: cast to bf16, cos at position 8000 was off by 1.77."""
    make_model("llama").save_pretrained(tmp_path)
    ours = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert ours.dtype == torch.bfloat16 and ours.model.rotary_emb.inv_freq.dtype == torch.float32
    x, positions = torch.zeros(1, 3, 32, dtype=torch.bfloat16), torch.tensor([[1, 1000, 8000]])
    cos, sin = ours.model.rotary_emb(x, positions)
    their_cos, their_sin = theirs.model.rotary_emb(x, positions)
    assert torch.equal(cos, their_cos) and torch.equal(sin, their_sin)
    exact = LlamaForCausalLM(tiny_llama_config()).model.rotary_emb(x.float(), positions)[0]
    assert (cos.float() - exact).abs().max() < 0.01  # bf16 rounding of the result only
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, theirs(input_ids=ids).logits, rtol=0, atol=0)
