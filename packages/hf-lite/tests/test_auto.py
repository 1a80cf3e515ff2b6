"""Auto classes map model_type -> classes through registries users can extend."""

import pytest
import torch
import transformers
from hf_lite import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    GPT2Tokenizer,
    LlamaConfig,
    LlamaModel,
    PreTrainedTokenizerFast,
)
from hf_lite_testing import make_model


def test_auto_classes_pick_by_model_type(tmp_path):
    for kind, config_cls, base_cls in [("gpt2", GPT2Config, GPT2Model), ("llama", LlamaConfig, LlamaModel)]:
        model = make_model(kind)
        model.save_pretrained(tmp_path / kind)
        assert isinstance(AutoConfig.from_pretrained(tmp_path / kind), config_cls)
        assert isinstance(AutoModel.from_pretrained(tmp_path / kind), base_cls)
        assert type(AutoModelForCausalLM.from_pretrained(tmp_path / kind)) is type(model)
    assert isinstance(AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=8, n_head=2)), GPT2LMHeadModel)


@pytest.fixture
def clean_registries():
    from hf_lite.models.auto import configuration_auto, modeling_auto, tokenization_auto

    saved = [
        dict(m)
        for m in (
            configuration_auto.CONFIG_MAPPING,
            modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING,
            tokenization_auto.TOKENIZER_MAPPING,
        )
    ]
    yield
    for mapping, old in zip(
        (
            configuration_auto.CONFIG_MAPPING,
            modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING,
            tokenization_auto.TOKENIZER_MAPPING,
        ),
        saved,
    ):
        mapping.clear()
        mapping.update(old)


def test_auto_register_custom_model_and_tokenizer(tmp_path, trained_tokenizer_dir, clean_registries):
    class TinyConfig(GPT2Config):
        model_type = "tiny-test"

    class TinyModel(GPT2LMHeadModel):
        config_class = TinyConfig

    AutoConfig.register("tiny-test", TinyConfig)
    AutoModelForCausalLM.register(TinyConfig, TinyModel)
    AutoTokenizer.register(TinyConfig, slow_tokenizer_class=GPT2Tokenizer)
    with pytest.raises(ValueError, match="already used"):
        AutoConfig.register("tiny-test", TinyConfig)
    with pytest.raises(ValueError, match="not consistent"):
        AutoConfig.register("other-name", TinyConfig)
    torch.manual_seed(0)
    model = TinyModel(TinyConfig(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is TinyModel
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
    # tokenizer lookup by the registered model_type (no tokenizer_class in the directory)
    import shutil

    shutil.copy(f"{trained_tokenizer_dir}/tokenizer.json", tmp_path / "tokenizer.json")
    assert isinstance(AutoTokenizer.from_pretrained(tmp_path), GPT2Tokenizer)


def test_auto_errors():
    with pytest.raises(ValueError, match="Unrecognized model_type 'gpt5'"):
        AutoConfig.for_model("gpt5")
    with pytest.raises(OSError, match="from_pretrained"):
        AutoModel()


def test_auto_tokenizer_prefers_fast(trained_tokenizer_dir):
    assert isinstance(AutoTokenizer.from_pretrained(trained_tokenizer_dir), PreTrainedTokenizerFast)
    assert isinstance(AutoTokenizer.from_pretrained(trained_tokenizer_dir, use_fast=False), GPT2Tokenizer)


def test_config_to_dict_round_trip_and_unknown_keys(tmp_path):
    cfg = GPT2Config(n_embd=16, n_head=2, n_layer=1, my_custom_key={"a": [1, 2]})
    assert cfg.hidden_size == 16 and cfg.num_hidden_layers == 1  # attribute_map aliases
    cfg.hidden_size = 24
    assert cfg.n_embd == 24
    cfg.save_pretrained(tmp_path)
    again = GPT2Config.from_pretrained(tmp_path)
    assert again == cfg and again.my_custom_key == {"a": [1, 2]}
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert theirs.n_embd == 24 and theirs.model_type == "gpt2"
    theirs.save_pretrained(tmp_path / "hf")
    back = AutoConfig.from_pretrained(tmp_path / "hf")
    assert back.n_embd == 24 and back.n_layer == 1
    with pytest.raises(ValueError, match="divisible"):
        GPT2Config(n_embd=10, n_head=3)
