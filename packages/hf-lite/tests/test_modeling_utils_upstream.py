"""Loading cases of transformers' tests/utils/test_modeling_utils.py that use its small custom models
(``BaseModel`` / ``ModelWithHead``, tied weights, ``NoSuperInitConfig``), each written again here for hf-lite and
run against transformers where the two should agree: base checkpoint -> head model and back, tied keys on
reload, a config without ``super().__init__()``, ``pytorch_model.bin`` checkpoints (single and sharded), and
``from_pretrained`` keyword arguments naming config attributes."""

import json
import os

import pytest
import torch
import transformers
from hf_lite import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM, PretrainedConfig, PreTrainedModel
from hf_lite_testing import make_model
from torch import nn


class BaseModel(PreTrainedModel):
    base_model_prefix = "base"
    config_class = PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        self.linear = nn.Linear(5, 5)
        self.linear_2 = nn.Linear(5, 5)
        self.post_init()

    def forward(self, x):
        return self.linear_2(self.linear(x))


class ModelWithHead(PreTrainedModel):
    """``linear`` is also a name inside the base model, on purpose (as in transformers' test)."""

    base_model_prefix = "base"
    config_class = PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        self.base = BaseModel(config)
        self.linear = nn.Linear(5, 5)
        self.linear2 = nn.Linear(5, 5)
        self.post_init()


class BaseModelWithTiedWeights(PreTrainedModel):
    config_class = PretrainedConfig

    def __init__(self, config):
        super().__init__(config)
        self.linear = nn.Linear(5, 5)
        self.linear_2 = nn.Linear(5, 5)

    def tie_weights(self):
        self.linear_2.weight = self.linear.weight


class NoSuperInitConfig(PretrainedConfig):
    model_type = ""

    def __init__(self, attribute=1, **kwargs):
        self.attribute = attribute


class NoSuperInitModel(PreTrainedModel):
    config_class = NoSuperInitConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.linear = nn.Linear(config.attribute, config.attribute)


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def test_base_model_checkpoint_loads_into_the_head_model_and_back(tmp_path):
    torch.manual_seed(0)
    base = BaseModel(PretrainedConfig())
    base.save_pretrained(tmp_path / "base")
    head, info = ModelWithHead.from_pretrained(tmp_path / "base", output_loading_info=True)
    assert _max_diff(head.base, base) == 0.0  # not into the head's own `linear`
    assert sorted(info["missing_keys"]) == ["linear.bias", "linear.weight", "linear2.bias", "linear2.weight"]
    assert info["unexpected_keys"] == []
    head.save_pretrained(tmp_path / "head")
    again, info = ModelWithHead.from_pretrained(tmp_path / "head", output_loading_info=True)
    assert _max_diff(again, head) == 0.0 and info["missing_keys"] == info["unexpected_keys"] == []
    back, info = BaseModel.from_pretrained(tmp_path / "head", output_loading_info=True)
    assert _max_diff(back, head.base) == 0.0 and info["missing_keys"] == []
    assert sorted(info["unexpected_keys"]) == ["linear.bias", "linear.weight", "linear2.bias", "linear2.weight"]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_base_llama_and_gpt2_checkpoints_load_into_head_models_as_in_transformers(tmp_path, kind):
    head = make_model(kind)
    base = head.base_model
    base.save_pretrained(tmp_path)
    ours, info = type(head).from_pretrained(tmp_path, output_loading_info=True)
    theirs, t_info = getattr(transformers, type(head).__name__).from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["missing_keys"]) == sorted(t_info["missing_keys"])
    assert sorted(info["unexpected_keys"]) == sorted(t_info["unexpected_keys"]) == []
    assert _max_diff(ours.base_model, base) == 0.0


def test_tied_weights_are_neither_saved_twice_nor_reported_missing(tmp_path):
    from safetensors.torch import load_file

    model = BaseModelWithTiedWeights(PretrainedConfig())
    model.tie_weights()
    model.save_pretrained(tmp_path)
    assert sorted(load_file(tmp_path / "model.safetensors")) == ["linear.bias", "linear.weight", "linear_2.bias"]
    new, info = BaseModelWithTiedWeights.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == []
    assert new.linear_2.weight is new.linear.weight
    assert _max_diff(new, model) == 0.0


def test_config_without_super_init_loads(tmp_path):
    config = NoSuperInitConfig(attribute=32)
    model = NoSuperInitModel(config)
    model.save_pretrained(tmp_path)
    new = NoSuperInitModel.from_pretrained(tmp_path)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), new.parameters()))
    assert new.config.attribute == 32


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_pytorch_model_bin_checkpoints_load_as_in_transformers(tmp_path, shard):
    model = make_model("llama")
    kw = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(tmp_path, safe_serialization=False, **kw)
    names = sorted(os.listdir(tmp_path))
    assert not any(n.endswith(".safetensors") for n in names)
    assert ("pytorch_model.bin" in names) if shard is None else ("pytorch_model.bin.index.json" in names)
    ids = torch.tensor([[1, 5, 9, 3]])
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    for kwargs in ({}, {"use_safetensors": False}):
        ours, info = LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True, **kwargs)
        assert info["missing_keys"] == info["unexpected_keys"] == []
        torch.testing.assert_close(ours(ids).logits, model(ids).logits, rtol=0, atol=0)
    torch.testing.assert_close(theirs(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    # transformers 5.24 writes safetensors whatever safe_serialization says; a .bin of its full state dict, as
    # transformers 4 wrote them, loads too
    theirs.save_pretrained(tmp_path / "t")
    os.remove(tmp_path / "t" / "model.safetensors")
    torch.save(theirs.state_dict(), tmp_path / "t" / "pytorch_model.bin")
    torch.testing.assert_close(LlamaForCausalLM.from_pretrained(tmp_path / "t")(ids).logits, model(ids).logits)


def test_use_safetensors_false_reads_the_bin_when_both_are_there(tmp_path):
    model = make_model("llama")
    model.save_pretrained(tmp_path, safe_serialization=False)
    other = make_model("llama", seed=3)
    other.save_pretrained(tmp_path)  # model.safetensors beside the .bin
    ids = torch.tensor([[1, 5, 9, 3]])
    torch.testing.assert_close(LlamaForCausalLM.from_pretrained(tmp_path)(ids).logits, other(ids).logits)
    bin_loaded = LlamaForCausalLM.from_pretrained(tmp_path, use_safetensors=False)
    torch.testing.assert_close(bin_loaded(ids).logits, model(ids).logits)
    with pytest.raises(OSError, match="model.safetensors"):
        make_model("llama").save_pretrained(tmp_path / "bin_only", safe_serialization=False)
        LlamaForCausalLM.from_pretrained(tmp_path / "bin_only", use_safetensors=True)


@pytest.mark.parametrize(
    "kw",
    [
        dict(output_attentions=True),
        dict(output_hidden_states=True),
        dict(return_dict=False),
        dict(rms_norm_eps=1e-3),
        dict(max_length=20),
        dict(foo=1),
    ],
    ids=lambda kw: next(iter(kw)),
)
def test_from_pretrained_kwargs_go_to_the_config_as_in_transformers(tmp_path, kw):
    make_model("llama").save_pretrained(tmp_path)
    key, value = next(iter(kw.items()))
    results = []
    for lib in (transformers, None):
        load = lib.AutoModelForCausalLM.from_pretrained if lib else AutoModelForCausalLM.from_pretrained
        try:
            results.append(("ok", getattr(load(tmp_path, **kw).config, key)))
        except TypeError as err:
            results.append(("TypeError", "unexpected keyword argument" in str(err)))
    assert results[1] == results[0]
    t_config, t_unused = transformers.AutoConfig.from_pretrained(tmp_path, return_unused_kwargs=True, **kw)
    o_config, o_unused = AutoConfig.from_pretrained(tmp_path, return_unused_kwargs=True, **kw)
    assert o_unused == t_unused
    assert getattr(o_config, key, None) == getattr(t_config, key, None)


def test_base_config_attributes_are_transformers(tmp_path):
    theirs = transformers.PretrainedConfig().to_dict()
    ours = PretrainedConfig().to_dict()
    for key in ("output_hidden_states", "output_attentions", "return_dict", "chunk_size_feed_forward",
                "problem_type", "is_encoder_decoder"):
        assert ours[key] == theirs[key], key
    make_model("llama").save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["return_dict"] is True
