"""PreTrainedModel: sharded safetensors + index, loading reports, clear errors, dtype, resizing, counts."""

import json
import os
import struct

import pytest
import torch
import transformers
from hf_lite import AutoModelForCausalLM, CheckpointError, GPT2LMHeadModel, LlamaForCausalLM
from hf_lite.checkpoint_utils import convert_file_size_to_int
from hf_lite_testing import make_model


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
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight' "
                                              r"has shape \(\d+, \d+\) but LlamaForCausalLM expects"):
        LlamaForCausalLM.from_pretrained(tmp_path)
    model, info = LlamaForCausalLM.from_pretrained(tmp_path, ignore_mismatched_sizes=True, output_loading_info=True)
    assert len(info["mismatched_keys"]) == 6  # gate/up/down in 2 layers
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (40, 32)


def test_missing_directory_and_files_raise_clear_errors(tmp_path):
    with pytest.raises(OSError, match="does not contain a file named config.json"):
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
