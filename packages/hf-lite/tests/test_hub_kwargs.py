"""The keyword arguments every Hugging Face script passes to ``from_pretrained`` / ``from_config`` (as
``run_clm.py`` does), at their defaults or with local values: accepted by hf-lite's Auto classes and model /
config / tokenizer classes, changing nothing on a local directory; ``from_tf=True`` and ``trust_remote_code=True``
for a config that needs remote code are clear errors. Mirrors the kwargs of transformers'
tests/models/auto/test_modeling_auto.py and examples/pytorch/language-modeling/run_clm.py."""

import json

import pytest
import torch
from hf_lite import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Tokenizer,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from hf_lite_testing import make_model

HUB = dict(cache_dir=None, revision="main", token=None, trust_remote_code=False)


@pytest.fixture
def checkpoint(tmp_path, trained_tokenizer_dir):
    model = make_model("llama", vocab_size=800)
    model.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(trained_tokenizer_dir).save_pretrained(tmp_path)
    return tmp_path, model


def test_auto_classes_accept_the_hub_kwargs_run_clm_passes(checkpoint, tmp_path_factory):
    path, model = checkpoint
    cache = str(tmp_path_factory.mktemp("cache"))
    config = AutoConfig.from_pretrained(path, **{**HUB, "cache_dir": cache})
    assert config == AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path, use_fast=True, **HUB)
    assert tok("def f(x):")["input_ids"] == AutoTokenizer.from_pretrained(path)("def f(x):")["input_ids"]
    for slow_or_fast in (GPT2Tokenizer, PreTrainedTokenizerFast):
        assert slow_or_fast.from_pretrained(path, **HUB)("import os")["input_ids"] == tok("import os")["input_ids"]
    ids = torch.tensor([[3, 5, 7]])
    for kwargs in (
        dict(from_tf=False, config=config, dtype=None, **HUB),
        dict(from_tf=False, config=config, dtype="auto", low_cpu_mem_usage=True, **HUB),
        dict(torch_dtype=torch.float32, force_download=False, local_files_only=True, **HUB),
    ):
        loaded = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert LlamaForCausalLM.from_pretrained(path, **HUB).config.vocab_size == 800
    fresh = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    assert type(fresh) is LlamaForCausalLM
    assert type(AutoModel.from_config(config, trust_remote_code=False, dtype=torch.bfloat16)).__name__ == "LlamaModel"
    assert config.to_dict() == AutoConfig.from_pretrained(path).to_dict()


def test_from_tf_and_remote_code_are_clear_errors(checkpoint):
    path, _ = checkpoint
    with pytest.raises(ValueError, match="from_tf=True.*TensorFlow"):
        AutoModelForCausalLM.from_pretrained(path, from_tf=True)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_custom.CustomConfig"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code=True.*does not run code"):
        AutoConfig.from_pretrained(path, trust_remote_code=True)
    with pytest.raises(ValueError, match="trust_remote_code=True.*does not run code"):
        AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
    # without it the config's own model_type (llama) loads, as transformers does for a known type
    assert AutoConfig.from_pretrained(path, trust_remote_code=False).model_type == "llama"
