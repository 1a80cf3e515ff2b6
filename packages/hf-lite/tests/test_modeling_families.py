"""The decoder families beside GPT-2 and Llama (OPT, Mistral, Qwen2, Qwen3, Gemma, Phi-3), each on a tiny random model
that transformers builds with its own config class and saves: hf-lite loads it through the Auto classes with
transformers' state-dict keys, gives the same logits on a left-padded batch, the same greedy and beam-search tokens,
and its own ``save_pretrained`` loads back in transformers with the same logits. Then the sequence-classification
heads (GPT-2, Llama and the families) against transformers': pooled logits and the loss of every ``problem_type``.

Mirrors transformers' ``tests/models/<family>/test_modeling_<family>.py`` parity checks (hf-lite's own differential
suite; no upstream file runs here)."""

import copy
import json

import pytest
import torch
import transformers
from hf_lite import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification
from safetensors import safe_open

SMALL = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 64}
LLAMA_LIKE = {**SMALL, "intermediate_size": 37, "num_key_value_heads": 2}
# name -> (transformers config class, its kwargs, the hf-lite class AutoModelForCausalLM must give)
FAMILIES = {
    "mistral": ("MistralConfig", {**LLAMA_LIKE, "sliding_window": 5}, "MistralForCausalLM"),
    "mistral_no_window": ("MistralConfig", {**LLAMA_LIKE, "sliding_window": None}, "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", {**LLAMA_LIKE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
              "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", {**LLAMA_LIKE, "head_dim": 16, "tie_word_embeddings": True}, "Qwen3ForCausalLM"),
    "gemma": ("GemmaConfig", {**LLAMA_LIKE, "head_dim": 16}, "GemmaForCausalLM"),
    "phi3": ("Phi3Config", {**LLAMA_LIKE, "pad_token_id": 98, "eos_token_id": 97}, "Phi3ForCausalLM"),
    "phi3_window": ("Phi3Config", {**LLAMA_LIKE, "pad_token_id": 98, "eos_token_id": 97, "sliding_window": 4},
                    "Phi3ForCausalLM"),
    "opt": ("OPTConfig", {**SMALL, "ffn_dim": 37, "word_embed_proj_dim": 16, "dropout": 0.0}, "OPTForCausalLM"),
    "opt_350m_style": ("OPTConfig", {**SMALL, "ffn_dim": 37, "do_layer_norm_before": False, "dropout": 0.0},
                       "OPTForCausalLM"),
}
PAD = 0


def _batch(seed=0, length=11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 97, (3, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, :1] = 0, 0  # left padding
    return ids.masked_fill(mask == 0, PAD), mask


def _perturb(model, seed):
    """Random weights everywhere, biases and norm weights included (they start at 0 / 1, where a missed bias or
    Gemma's (1 + w) would go unnoticed)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.fixture(params=list(FAMILIES), scope="module")
def family(request, tmp_path_factory):
    """(name, transformers model, directory it saved, hf-lite model loaded from it by AutoModelForCausalLM)."""
    config_name, kwargs, _ = FAMILIES[request.param]
    config = getattr(transformers, config_name)(**kwargs)
    torch.manual_seed(0)
    theirs = transformers.AutoModelForCausalLM.from_config(config).eval()
    _perturb(theirs, seed=len(request.param))
    directory = tmp_path_factory.mktemp(request.param)
    theirs.save_pretrained(directory)
    ours = AutoModelForCausalLM.from_pretrained(directory)
    return request.param, theirs, directory, ours


def _logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def test_auto_classes_load_transformers_checkpoint_with_its_keys(family):
    name, theirs, directory, ours = family
    assert type(ours).__name__ == FAMILIES[name][2]
    assert type(ours).__module__.startswith("hf_lite.")
    assert type(AutoConfig.from_pretrained(directory)).__name__ == type(theirs.config).__name__
    assert type(AutoModel.from_pretrained(directory)).__name__ == type(theirs.base_model).__name__
    assert set(ours.state_dict()) == set(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        assert ours.state_dict()[key].shape == value.shape, key


def test_padded_batch_logits_match_transformers(family):
    _, theirs, _, ours = family
    ids, mask = _batch()
    expected = _logits(theirs, ids, mask)
    got = _logits(ours, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=0)  # the same kernels in the same order


def test_hidden_states_and_attentions_match_transformers_eager(family):
    """``output_hidden_states`` (embeddings, then each block, the last after the final norm) and
    ``output_attentions`` (the eager softmax) as transformers' eager attention returns them."""
    _, _, directory, ours = family
    theirs = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    ids, mask = _batch()
    real = mask.bool()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        got = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
    assert len(got.hidden_states) == len(expected.hidden_states) and len(got.attentions) == len(expected.attentions)
    for mine, reference in zip(got.hidden_states, expected.hidden_states):
        torch.testing.assert_close(mine[real], reference[real], rtol=1e-5, atol=1e-5)
    for mine, reference in zip(got.attentions, expected.attentions):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-6)


def test_bf16_checkpoint_loads_in_bf16_with_transformers_logits(family, tmp_path):
    """A bf16 checkpoint with ``dtype="auto"`` stays bf16 and gives transformers' bf16 logits (Gemma's embedding
    scale rounded to bf16 as transformers rounds it)."""
    _, theirs, _, _ = family
    copy.deepcopy(theirs).to(torch.bfloat16).save_pretrained(tmp_path)  # the fixture's fp32 weights stay
    ours = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto")
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto").eval()
    assert ours.dtype == reference.dtype == torch.bfloat16
    ids, mask = _batch()
    real = mask.bool()
    torch.testing.assert_close(_logits(ours, ids, mask)[real], _logits(reference, ids, mask)[real], rtol=0, atol=0)


def test_greedy_and_beam_generate_token_identical(family):
    _, theirs, _, ours = family
    ids, mask = _batch(seed=1, length=7)
    for kwargs in ({"do_sample": False}, {"do_sample": False, "num_beams": 3, "num_return_sequences": 2}):
        common = {"max_new_tokens": 9, "pad_token_id": PAD, "eos_token_id": None, **kwargs}
        with torch.no_grad():
            expected = theirs.generate(input_ids=ids, attention_mask=mask, **common)
            got = ours.generate(input_ids=ids, attention_mask=mask, **common)
        assert torch.equal(got, expected), kwargs


def test_save_pretrained_loads_back_in_transformers(family, tmp_path):
    _, theirs, directory, ours = family
    ours.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as ours_file, \
            safe_open(str(directory / "model.safetensors"), "pt") as theirs_file:
        assert set(ours_file.keys()) == set(theirs_file.keys())
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again) is type(theirs)
    ids, mask = _batch(seed=2)
    real = mask.bool()
    torch.testing.assert_close(_logits(again, ids, mask)[real], _logits(theirs, ids, mask)[real], rtol=0, atol=0)


def test_loss_and_gradients_match_transformers_with_checkpointing(family):
    """Training through each family: the loss over -100-masked labels and every parameter's gradient as transformers
    computes them, with hf-lite recomputing its blocks in backward (gradient checkpointing)."""
    _, theirs, directory, _ = family
    ours = AutoModelForCausalLM.from_pretrained(directory)
    ours.gradient_checkpointing_enable()
    ours.train()
    theirs.train()
    ids, mask = _batch(seed=3)
    labels = ids.masked_fill(mask == 0, -100)
    theirs.zero_grad()
    expected = theirs(input_ids=ids, attention_mask=mask, labels=labels).loss
    expected.backward()
    got = ours(input_ids=ids, attention_mask=mask, labels=labels).loss
    got.backward()
    theirs.eval()  # the module-scoped fixture's model goes back as the other tests expect it
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    grads = {name: p.grad for name, p in theirs.named_parameters() if p.grad is not None}
    assert grads and {name for name, p in ours.named_parameters() if p.grad is not None} == set(grads)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-5, atol=1e-6, msg=name)
    theirs.zero_grad()


# config.json as the hub's checkpoints ship it (transformers 4.x spellings: top-level rope_theta, rope_scaling null,
# torch_dtype, Gemma's legacy hidden_act "gelu", OPT's _remove_final_layer_norm / prefix), sizes shrunk.
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
        "vocab_size": 99, "torch_dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True}
HUB_CONFIGS = {
    "Qwen2.5": {**TINY, "model_type": "qwen2", "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
                "max_position_embeddings": 32768, "max_window_layers": 24, "num_key_value_heads": 2,
                "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
                "use_sliding_window": False, "attention_dropout": 0.0},
    "Qwen3": {**TINY, "model_type": "qwen3", "attention_bias": False, "head_dim": 16, "num_key_value_heads": 2,
              "max_position_embeddings": 40960, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
              "tie_word_embeddings": True, "use_sliding_window": False, "max_window_layers": 28},
    "gemma-2b": {**TINY, "model_type": "gemma", "head_dim": 16, "hidden_act": "gelu", "hidden_activation": None,
                 "num_key_value_heads": 1, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
                 "rope_scaling": None, "rope_theta": 10000.0, "attention_bias": False},
    "Phi-3-mini-4k": {**TINY, "model_type": "phi3", "vocab_size": 32064, "bos_token_id": 1, "eos_token_id": 32000,
                      "pad_token_id": 32000, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "rope_scaling": None,
                      "original_max_position_embeddings": 4096, "max_position_embeddings": 4096,
                      "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 2047},
    "Mistral-7B-v0.1": {**TINY, "model_type": "mistral", "num_key_value_heads": 2, "rope_theta": 10000.0,
                        "sliding_window": 4096, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05},
    "opt-125m": {"model_type": "opt", "_remove_final_layer_norm": False, "activation_dropout": 0.0,
                 "activation_function": "relu", "do_layer_norm_before": True, "dropout": 0.1, "ffn_dim": 64,
                 "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2, "prefix": "</s>",
                 "torch_dtype": "float16", "vocab_size": 99, "word_embed_proj_dim": 32, "pad_token_id": 1},
}


@pytest.mark.parametrize("name", list(HUB_CONFIGS))
def test_hub_style_config_json_loads_as_transformers_loads_it(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIGS[name]))
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIGS[name]))  # the hub's file beside the weights
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(ours).__name__ == type(theirs).__name__
    for key in ("sliding_window", "hidden_act", "head_dim", "num_key_value_heads", "word_embed_proj_dim"):
        if hasattr(theirs.config, key):  # hf-lite also keeps a derived head_dim where transformers derives it late
            assert getattr(ours.config, key) == getattr(theirs.config, key), key
    if hasattr(theirs.config, "rope_parameters"):
        assert ours.config.rope_parameters["rope_theta"] == theirs.config.rope_parameters["rope_theta"]
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(ours, ids, None), _logits(theirs, ids, None), rtol=0, atol=0)


def test_sliding_window_changes_the_result():
    """The window is live in the tests above: the same Mistral weights without it give other logits."""
    config = transformers.MistralConfig(**LLAMA_LIKE, sliding_window=3)
    torch.manual_seed(0)
    windowed = transformers.MistralForCausalLM(config).eval()
    from hf_lite.models.mistral import MistralConfig, MistralForCausalLM

    ours = MistralForCausalLM(MistralConfig(**LLAMA_LIKE, sliding_window=3)).eval()
    ours.load_state_dict(windowed.state_dict())
    ids, mask = _batch()
    full = MistralForCausalLM(MistralConfig(**LLAMA_LIKE, sliding_window=None)).eval()
    full.load_state_dict(windowed.state_dict())
    real = mask.bool()
    torch.testing.assert_close(_logits(ours, ids, mask)[real], _logits(windowed, ids, mask)[real], rtol=0, atol=0)
    assert not torch.allclose(_logits(full, ids, mask)[real], _logits(windowed, ids, mask)[real], atol=1e-3)


@pytest.mark.parametrize("name", ["MistralConfig", "Qwen2Config", "Qwen3Config", "GemmaConfig", "Phi3Config",
                                  "OPTConfig"])
def test_config_signature_is_transformers(name):
    """Each family config takes transformers' own fields with its defaults (the base config's shared fields aside)."""
    import dataclasses
    import inspect

    import hf_lite

    shared = {f.name for f in dataclasses.fields(transformers.PreTrainedConfig)} - {
        "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings", "use_cache"}
    theirs = {f.name: f.default for f in dataclasses.fields(getattr(transformers, name))
              if f.default is not dataclasses.MISSING and f.name not in shared}
    ours = {k: p.default for k, p in inspect.signature(getattr(hf_lite, name).__init__).parameters.items()
            if k not in ("self", "kwargs")}
    assert ours == theirs


def test_unsupported_variants_are_refused_by_name():
    from hf_lite.models.phi3 import Phi3Config
    from hf_lite.models.qwen2 import Qwen2Config

    with pytest.raises(ValueError, match="sliding-window layers"):
        Qwen2Config(**LLAMA_LIKE, use_sliding_window=True, max_window_layers=1)
    with pytest.raises(ValueError, match="longrope"):
        Phi3Config(**LLAMA_LIKE, rope_scaling={"type": "longrope", "short_factor": [1.0] * 4,
                                                "long_factor": [1.0] * 4})


# ---------------------------------------------------------------------------------------------- sequence classification
CLASSIFIERS = {
    "gpt2": ("GPT2Config", {"vocab_size": 99, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}),
    "llama": ("LlamaConfig", LLAMA_LIKE),
    "qwen2": ("Qwen2Config", LLAMA_LIKE),
    "opt": ("OPTConfig", {**SMALL, "ffn_dim": 37, "word_embed_proj_dim": 16, "dropout": 0.0}),
    "mistral": ("MistralConfig", {**LLAMA_LIKE, "sliding_window": 5}),
    "qwen3": ("Qwen3Config", {**LLAMA_LIKE, "head_dim": 16}),
    "gemma": ("GemmaConfig", {**LLAMA_LIKE, "head_dim": 16}),
    "phi3": ("Phi3Config", LLAMA_LIKE),
}
PROBLEMS = {
    "single_label_classification": (3, lambda g: torch.randint(0, 3, (3,), generator=g)),
    "regression": (1, lambda g: torch.randn(3, generator=g)),
    "multi_label_classification": (3, lambda g: torch.randint(0, 2, (3, 3), generator=g).float()),
}


@pytest.mark.parametrize("problem", list(PROBLEMS))
@pytest.mark.parametrize("kind", list(CLASSIFIERS))
def test_sequence_classification_logits_and_loss_match_transformers(kind, problem, tmp_path):
    config_name, kwargs = CLASSIFIERS[kind]
    num_labels, make_labels = PROBLEMS[problem]
    config = getattr(transformers, config_name)(**kwargs, num_labels=num_labels, pad_token_id=PAD)
    torch.manual_seed(0)
    theirs = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    _perturb(theirs, seed=3)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = AutoModelForSequenceClassification.from_pretrained(tmp_path / "theirs")
    assert type(ours).__name__ == type(theirs).__name__ and ours.config.num_labels == num_labels
    assert set(ours.state_dict()) == set(theirs.state_dict())
    labels = make_labels(torch.Generator().manual_seed(4))
    ids, mask = _batch()
    ids[2, -3:], mask[2, -3:] = PAD, 0  # a right-padded row: pooled at its last real token
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, labels=labels)
        got = ours(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=0)
    assert ours.config.problem_type == theirs.config.problem_type == problem
    ours.save_pretrained(tmp_path / "ours")
    again = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids, attention_mask=mask).logits, expected.logits, rtol=0, atol=0)


def test_sequence_classification_without_pad_token_needs_batch_of_one(tmp_path):
    config = transformers.LlamaConfig(**LLAMA_LIKE, num_labels=2)
    transformers.LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    ours = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    ids, _ = _batch()
    with pytest.raises(ValueError, match="no padding token"):
        ours(input_ids=ids)
    assert ours(input_ids=ids[:1]).logits.shape == (1, 2)


def test_num_labels_and_label_maps_as_transformers():
    ours = AutoConfig.for_model("llama", **LLAMA_LIKE, num_labels=4)
    theirs = transformers.LlamaConfig(**LLAMA_LIKE, num_labels=4)
    assert ours.num_labels == 4 and ours.id2label == theirs.id2label and ours.label2id == theirs.label2id
    ours.num_labels = 2
    assert ours.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    assert transformers.LlamaConfig(**LLAMA_LIKE).num_labels == AutoConfig.for_model("llama").num_labels == 2
