"""PreTrainedModel loading and saving: sharded safetensors + index, variants, subfolders, loading reports, key
renaming, uninitialised building, clear errors, dtype, resizing, counts.

Mirrors transformers' tests/utils/test_modeling_utils.py (tiny local models instead of hub checkpoints), plus
parity checks against the installed transformers.
"""

import json
import os
import shutil
import struct

import pytest
import torch
import transformers
from hf_lite import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    CheckpointError,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaForCausalLM,
    PreTrainedModel,
)
from hf_lite.checkpoint_utils import convert_file_size_to_int
from hf_lite.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel
from hf_lite_testing import make_model, tiny_gpt2_config
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


def test_sharded_checkpoint_roundtrip_and_transformers_reads_it(tmp_path):
    model = make_model("llama")
    model.save_pretrained(tmp_path, max_shard_size="30KB")
    files = sorted(os.listdir(tmp_path))
    shards = [f for f in files if f.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors" not in files
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in model.state_dict().values())
    ids = torch.randint(0, 97, (2, 9))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ours = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        torch.testing.assert_close(theirs(input_ids=ids).logits, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(input_ids=ids).logits, ref, rtol=0, atol=0)
    # transformers' own sharded save loads in hf-lite
    theirs.save_pretrained(tmp_path / "hf", max_shard_size="30KB")
    assert os.path.exists(tmp_path / "hf" / "model.safetensors.index.json")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=ids).logits, ref, rtol=1e-6, atol=1e-6)
    # re-saving unsharded removes the stale shards and index
    ours.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "generation_config.json", "hf", "model.safetensors"]


def test_tied_weights_are_not_saved_and_retie_on_load(tmp_path):
    from safetensors import safe_open

    model = make_model("gpt2")
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "transformer.wte.weight" in keys
    loaded, info = GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    # the Trainer passes state_dict=model.state_dict(), tied copy included: it is still written once
    model.save_pretrained(tmp_path / "given", state_dict=model.state_dict())
    with safe_open(str(tmp_path / "given" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == keys
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert loaded.num_parameters() == model.num_parameters()


def test_missing_and_unexpected_keys_reported_like_transformers(tmp_path, caplog):
    from safetensors.torch import load_file, save_file

    model = make_model("llama")
    model.save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd.pop("model.norm.weight")
    sd["model.extra.weight"] = torch.zeros(3)
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level("WARNING"):
        _, info = LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == ["model.norm.weight"]
    assert info["unexpected_keys"] == ["model.extra.weight"]
    assert "newly initialized" in caplog.text and "were not used" in caplog.text
    _, theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(theirs["missing_keys"]) == set(info["missing_keys"])
    assert set(theirs["unexpected_keys"]) == set(info["unexpected_keys"])


def test_truncated_safetensors_names_file_and_tensor(tmp_path):
    model = make_model("gpt2")
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    last_file = sorted(set(index["weight_map"].values()))[-1]
    path = tmp_path / last_file
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 10])
    with pytest.raises(CheckpointError, match=rf"{last_file} is truncated: tensor '[\w.]+'"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="not even a safetensors header"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    # corrupted header JSON
    header_len = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(data[:8] + b"{" * header_len + data[8 + header_len :])
    with pytest.raises(CheckpointError, match="corrupted safetensors header"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    path.unlink()
    with pytest.raises(CheckpointError, match=rf"{last_file} is listed in .* but is missing"):
        GPT2LMHeadModel.from_pretrained(tmp_path)


def test_shape_mismatch_names_file_and_tensor_and_loads_nothing(tmp_path):
    make_model("llama").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 40
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' "
        r"has shape \(\d+, \d+\) but LlamaForCausalLM expects",
    ):
        LlamaForCausalLM.from_pretrained(tmp_path)
    model, info = LlamaForCausalLM.from_pretrained(tmp_path, ignore_mismatched_sizes=True, output_loading_info=True)
    assert len(info["mismatched_keys"]) == 6  # gate/up/down in 2 layers
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (40, 32)


def test_missing_directory_and_files_raise_clear_errors(tmp_path):
    with pytest.raises(OSError, match="nope' is not a local directory either"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "nope")
    (tmp_path / "config.json").write_text(make_model("gpt2").config.to_json_string())
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_dtype_auto_and_explicit(tmp_path):
    model = make_model("llama").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert LlamaForCausalLM.from_pretrained(tmp_path).dtype == torch.bfloat16
    assert LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).dtype == torch.float32
    assert LlamaForCausalLM.from_pretrained(tmp_path, dtype="float16", device_map="cpu").dtype == torch.float16
    with pytest.raises(ValueError, match="not a torch dtype"):
        LlamaForCausalLM.from_pretrained(tmp_path, dtype="float13")


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_num_parameters_and_resize_token_embeddings_match_transformers(kind, tmp_path):
    ours = make_model(kind)
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert ours.num_parameters() == theirs.num_parameters()
    assert ours.num_parameters(exclude_embeddings=True) == theirs.num_parameters(exclude_embeddings=True)
    ours.resize_token_embeddings(100, pad_to_multiple_of=8)
    theirs.resize_token_embeddings(100, pad_to_multiple_of=8)
    assert ours.config.vocab_size == theirs.config.vocab_size == 104
    assert ours.num_parameters() == theirs.num_parameters()
    torch.testing.assert_close(ours.get_input_embeddings().weight[:97], theirs.get_input_embeddings().weight[:97])
    new_rows = ours.get_input_embeddings().weight[97:]
    torch.testing.assert_close(new_rows, ours.get_input_embeddings().weight[:97].mean(0).expand_as(new_rows))
    with torch.no_grad():
        assert ours(input_ids=torch.tensor([[103]])).logits.shape[-1] == 104


def test_convert_file_size_to_int():
    assert convert_file_size_to_int("5GB") == 5 * 10**9
    assert convert_file_size_to_int("1GiB") == 2**30
    assert convert_file_size_to_int("200KB") == 200_000
    assert convert_file_size_to_int(123) == 123
    with pytest.raises(ValueError, match="max_shard_size"):
        convert_file_size_to_int("lots")


class _RecordAllocations(TorchDispatchMode):
    """Every op's name and the (dtype, shape) of the tensors it returns."""

    def __init__(self):
        super().__init__()
        self.ops, self.outputs = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append(func.overloadpacket.__name__)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.outputs.append((t.dtype, tuple(t.shape)))
        return out


def test_from_pretrained_builds_uninitialised_in_the_target_dtype(tmp_path, monkeypatch):
    """No random init (it is overwritten) and no fp32 copy of the weights when loading bf16."""
    make_model("llama").to(torch.bfloat16).save_pretrained(tmp_path)
    from hf_lite.models.llama.modeling_llama import LlamaPreTrainedModel

    shapes = {tuple(p.shape) for p in make_model("llama").parameters()}
    inits = []
    original = LlamaPreTrainedModel._init_weights
    monkeypatch.setattr(LlamaPreTrainedModel, "_init_weights", lambda self, m: inits.append(m) or original(self, m))
    with _RecordAllocations() as record:
        model = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert inits == [] and not {"normal_", "uniform_"} & set(record.ops)
    assert [o for o in record.outputs if o[0] == torch.float32 and o[1] in shapes] == []
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    # a module missing from the checkpoint is initialised (only it), the rest is the checkpoint's
    from safetensors.torch import load_file, save_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    del sd["lm_head.weight"]
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model, info = LlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == ["lm_head.weight"] and inits == [model.lm_head]
    assert abs(model.lm_head.weight.float().std().item() - 0.02) < 0.005
    torch.testing.assert_close(model.model.embed_tokens.weight, sd["model.embed_tokens.weight"], rtol=0, atol=0)


class _TiedInTieWeights(PreTrainedModel):
    """Ties its head in ``tie_weights`` without declaring ``_tied_weights_keys``."""

    config_class = GPT2Config

    def __init__(self, config):
        super().__init__(config)
        self.emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.out = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.emb

    def tie_weights(self):
        self.out.weight = self.emb.weight

    def forward(self, input_ids):
        return self.out(self.emb(input_ids))


def test_save_pretrained_dedupes_weights_a_model_ties_in_tie_weights(tmp_path):
    from safetensors import safe_open

    torch.manual_seed(0)
    model = _TiedInTieWeights(tiny_gpt2_config())
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert list(f.keys()) == ["emb.weight"]
    loaded, info = _TiedInTieWeights.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == [] and loaded.out.weight is loaded.emb.weight
    ids = torch.tensor([[1, 5, 9]])
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


class _GPT2WithFinalNorm(GPT2PreTrainedModel):
    """A head model whose own ``ln_f`` is named like the base model's."""

    def __init__(self, config):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.post_init()


def test_head_keys_named_like_base_keys_are_unexpected_when_loading_the_base_model(tmp_path):
    torch.manual_seed(0)
    head = _GPT2WithFinalNorm(tiny_gpt2_config())
    with torch.no_grad():
        head.ln_f.weight.fill_(7.0)
    head.save_pretrained(tmp_path)
    base, info = GPT2Model.from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["unexpected_keys"]) == ["ln_f.bias", "ln_f.weight"] and info["missing_keys"] == []
    torch.testing.assert_close(base.ln_f.weight, head.transformer.ln_f.weight, rtol=0, atol=0)


def test_mixed_prefixed_and_bare_keys_load_like_transformers(tmp_path):
    """Each key finds its model key on its own (transformers), instead of the whole file being judged at once."""
    from safetensors.torch import load_file, save_file

    make_model("gpt2").save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    mixed = {k if i % 2 else k.removeprefix("transformer."): v for i, (k, v) in enumerate(sorted(sd.items()))}
    assert any(k.startswith("transformer.") for k in mixed) and any(k.startswith("h.") for k in mixed)
    save_file(mixed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(0))
    for cls, theirs_cls in [(GPT2LMHeadModel, transformers.GPT2LMHeadModel), (GPT2Model, transformers.GPT2Model)]:
        ours, info = cls.from_pretrained(tmp_path, output_loading_info=True)
        assert info["missing_keys"] == [] and info["unexpected_keys"] == [], cls.__name__
        theirs = theirs_cls.from_pretrained(tmp_path).eval()
        with torch.no_grad():
            a, b = ours(input_ids=ids), theirs(input_ids=ids)
        key = "logits" if "logits" in a else "last_hidden_state"
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-5)


def test_unknown_from_pretrained_kwargs_raise_and_config_kwargs_override_like_transformers(tmp_path):
    make_model("llama").save_pretrained(tmp_path)
    config_before = (tmp_path / "config.json").read_text()
    for load in (LlamaForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(TypeError, match="unexpected keyword argument 'foo'"):
            load(tmp_path, foo=1)
        assert load(tmp_path, rms_norm_eps=1e-3).config.rms_norm_eps == 1e-3
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, rms_norm_eps=1e-3)
    assert theirs.config.rms_norm_eps == 1e-3
    assert (tmp_path / "config.json").read_text() == config_before
    with pytest.raises(ValueError, match=r"\['foo'\] are not attributes of LlamaConfig"):
        AutoConfig.from_pretrained(tmp_path, foo=1)
    config, unused = AutoConfig.from_pretrained(tmp_path, foo=1, rms_norm_eps=1e-4, return_unused_kwargs=True)
    assert unused == {"foo": 1} and config.rms_norm_eps == 1e-4
    with pytest.raises(OSError, match="use_safetensors=False but .* has no pytorch_model.bin"):
        LlamaForCausalLM.from_pretrained(tmp_path, use_safetensors=False)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['foo'\] \(without push_to_hub\)"):
        make_model("llama").save_pretrained(tmp_path / "x", foo=1)


def test_variant_files_are_named_and_read_like_transformers(tmp_path):
    model = make_model("llama")
    model.save_pretrained(tmp_path / "one", variant="fp16")
    model.save_pretrained(tmp_path / "sharded", variant="fp16", max_shard_size="30KB")
    assert "model.fp16.safetensors" in os.listdir(tmp_path / "one")
    names = sorted(os.listdir(tmp_path / "sharded"))
    assert "model.safetensors.index.fp16.json" in names and "model.fp16-00001-of-00004.safetensors" in names
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sharded", variant="fp16")
    theirs.save_pretrained(tmp_path / "hf", variant="fp16")
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(os.listdir(tmp_path / "one"))
    ids = torch.tensor([[3, 4, 5]])
    for directory in ("one", "sharded", "hf"):
        loaded = LlamaForCausalLM.from_pretrained(tmp_path / directory, variant="fp16")
        with torch.no_grad():
            torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(CheckpointError, match=r"no model.safetensors .*model.fp16.safetensors.*variant="):
        LlamaForCausalLM.from_pretrained(tmp_path / "one")
    # a second variant in the same directory leaves the first one alone
    model.save_pretrained(tmp_path / "one")
    assert {"model.fp16.safetensors", "model.safetensors"} <= set(os.listdir(tmp_path / "one"))


def test_subfolder_from_config_dtype_and_config_dtype_like_transformers(tmp_path, trained_tokenizer_dir):
    make_model("llama").save_pretrained(tmp_path / "sub")
    shutil.copy(os.path.join(trained_tokenizer_dir, "tokenizer.json"), tmp_path / "sub")
    assert isinstance(AutoModelForCausalLM.from_pretrained(tmp_path, subfolder="sub"), LlamaForCausalLM)
    assert AutoConfig.from_pretrained(tmp_path, subfolder="sub").model_type == "llama"
    assert AutoTokenizer.from_pretrained(tmp_path, subfolder="sub").encode("a b") != []
    model = LlamaForCausalLM.from_pretrained(tmp_path / "sub", dtype="bfloat16")
    assert model.config.dtype is torch.bfloat16 and model.config.torch_dtype is torch.bfloat16
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sub", dtype="bfloat16")
    assert theirs.config.dtype == model.config.dtype
    built = AutoModelForCausalLM.from_config(model.config, dtype=torch.bfloat16)
    assert built.dtype == torch.bfloat16 and built.model.rotary_emb.inv_freq.dtype == torch.float32
    assert AutoModelForCausalLM.from_config(model.config, torch_dtype="float16").dtype == torch.float16
    for bad in ("float13", "int64", 5):
        with pytest.raises(ValueError, match="dtype"):
            LlamaForCausalLM.from_pretrained(tmp_path / "sub", dtype=bad)
