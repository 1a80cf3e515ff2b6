"""The model families beside Llama and GPT-2 (vLLM's ``tests/models/language/generation/test_common.py``: greedy
outputs equal to transformers' on each architecture): OPT (pre- and post-norm, a narrow word embedding), Qwen2,
Qwen3, Gemma, Phi-3 and Mistral (and GPT-2), each a tiny random checkpoint saved by transformers in the test;
Phi-3 (fused q/k/v and gate/up tensors split by the loaders, 2 KV heads for 4 query heads), OPT and GPT-2 (fused
``Conv1D`` c_attn, read transposed) also at TP=2.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from paged_serve import LLM, SamplingParams

from .test_llm_engine import _prompts, hf_greedy

VOCAB, N_NEW = 300, 16
LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
FAMILIES = {
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
        ),
    ),  # fmt: skip
    "opt-350m-like": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            vocab_size=VOCAB,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            do_layer_norm_before=False,
            word_embed_proj_dim=32,
        ),
    ),  # fmt: skip
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", LLAMA_LIKE),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**LLAMA_LIKE, "head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**LLAMA_LIKE, "head_dim": 16, "num_key_value_heads": 1}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**LLAMA_LIKE, "pad_token_id": 0}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**LLAMA_LIKE, "sliding_window": None}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256)),
}


@pytest.fixture(scope="module")
def family_checkpoint(tmp_path_factory):
    cache = {}

    def make(name):
        if name not in cache:
            config_cls, model_cls, kw = FAMILIES[name]
            torch.manual_seed(0)
            model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kw)).eval()
            for p in model.parameters():  # wider weights than the 0.02 init: greedy picks without near-ties
                p.data.normal_(0, 0.2) if p.dim() > 1 else p.data.uniform_(-0.5, 0.5)
            path = tmp_path_factory.mktemp(name)
            model.save_pretrained(path)
            cache[name] = (str(path), model)
        return cache[name]

    return make


def _generate(path, prompts, **kw):
    llm = LLM(path, skip_tokenizer_init=True, num_gpu_blocks=64, **kw)
    try:
        params = SamplingParams(temperature=0, max_tokens=N_NEW, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [o.outputs[0].token_ids for o in outputs], llm.llm_engine.model
    finally:
        llm.llm_engine.shutdown()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_greedy_matches_transformers(family_checkpoint, name):
    path, hf = family_checkpoint(name)
    prompts = _prompts(VOCAB, n=4, seed=2)
    got, model = _generate(path, prompts)
    assert type(model).__name__ == FAMILIES[name][1].replace("Mistral", "Llama")
    assert got == hf_greedy(hf, prompts, n_new=N_NEW, eos_token_id=None)


@pytest.mark.parametrize("name", ["phi3", "opt", "gpt2"])
def test_family_at_tp2_matches_transformers(family_checkpoint, name, new_children):
    path, hf = family_checkpoint(name)
    prompts = _prompts(VOCAB, n=4, seed=4)
    got, _ = _generate(path, prompts, tensor_parallel_size=2)
    assert got == hf_greedy(hf, prompts, n_new=N_NEW, eos_token_id=None)
    assert not new_children()


def test_unsupported_variants_are_refused_by_name(tmp_path):
    config = transformers.Phi3Config(**{**LLAMA_LIKE, "pad_token_id": 0, "partial_rotary_factor": 0.5})
    transformers.Phi3ForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="partial_rotary_factor 0.5"):
        LLM(str(tmp_path), skip_tokenizer_init=True, num_gpu_blocks=8)
