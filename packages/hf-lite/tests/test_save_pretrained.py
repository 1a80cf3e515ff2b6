"""save_pretrained writes a directory the way a checkpoint must survive a crash: staged beside the target, fsynced,
swapped in whole; files get the umask's mode; only the main process writes; other files in the directory stay.

Mirrors the save cases of transformers' tests/utils/test_modeling_utils.py; the crash and mode cases are hf-lite's
own (transformers writes in place).
"""

import os

import pytest
import torch
from hf_lite import GPT2Tokenizer, LlamaForCausalLM
from hf_lite_testing import make_model


def _snapshot(directory) -> dict[str, bytes]:
    return {e: (directory / e).read_bytes() for e in sorted(os.listdir(directory)) if (directory / e).is_file()}


def _logits(model_dir):
    with torch.no_grad():
        return LlamaForCausalLM.from_pretrained(model_dir)(input_ids=torch.tensor([[3, 4, 5]])).logits


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_saved_files_get_the_umask_mode(tmp_path, umask_022, trained_tokenizer_dir):
    make_model("llama").save_pretrained(tmp_path / "ckpt", max_shard_size="30KB")
    GPT2Tokenizer.from_pretrained(trained_tokenizer_dir).save_pretrained(tmp_path / "ckpt")
    assert os.stat(tmp_path / "ckpt").st_mode & 0o777 == 0o755
    modes = {e: os.stat(tmp_path / "ckpt" / e).st_mode & 0o777 for e in os.listdir(tmp_path / "ckpt")}
    assert len(modes) > 6 and set(modes.values()) == {0o644}, modes


@pytest.mark.parametrize("exchange", ["renameat2", "rename_fallback"])
def test_a_crash_mid_save_leaves_the_previous_checkpoint_whole(exchange, tmp_path, monkeypatch):
    import hf_lite._infra.atomic_io as utils
    import hf_lite.checkpoint_utils as checkpoint_utils

    if exchange == "rename_fallback":
        monkeypatch.setattr(utils, "_exchange", lambda a, b: False)
    make_model("llama", seed=0).save_pretrained(tmp_path / "ckpt", max_shard_size="30KB")
    before, logits = _snapshot(tmp_path / "ckpt"), _logits(tmp_path / "ckpt")
    real_save, calls = checkpoint_utils.safetensors_save, []

    def dies_on_the_second_shard(tensors, metadata=None):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed mid-save")
        return real_save(tensors, metadata=metadata)

    monkeypatch.setattr(checkpoint_utils, "safetensors_save", dies_on_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        make_model("llama", seed=1).save_pretrained(tmp_path / "ckpt", max_shard_size="20KB")
    assert _snapshot(tmp_path / "ckpt") == before
    assert os.listdir(tmp_path) == ["ckpt"], "the staging directory is removed"
    torch.testing.assert_close(_logits(tmp_path / "ckpt"), logits, rtol=0, atol=0)


@pytest.mark.parametrize("exchange", ["renameat2", "rename_fallback"])
def test_the_new_checkpoint_appears_whole_and_other_files_stay(exchange, tmp_path, monkeypatch):
    import hf_lite._infra.atomic_io as utils
    import hf_lite.modeling_utils as modeling_utils

    if exchange == "rename_fallback":
        monkeypatch.setattr(utils, "_exchange", lambda a, b: False)
    target = tmp_path / "ckpt"
    make_model("llama", seed=0).save_pretrained(target, max_shard_size="30KB")
    (target / "tokenizer.json").write_text("{}")
    (target / "runs").mkdir()
    (target / "runs" / "events").write_text("log")
    before = _snapshot(target)
    seen_during_save = []
    real = modeling_utils.save_state_dict

    def watching(*args, **kwargs):
        names = real(*args, **kwargs)
        seen_during_save.append(_snapshot(target))  # everything of the new save is written, not yet swapped in
        return names

    monkeypatch.setattr(modeling_utils, "save_state_dict", watching)
    new = make_model("llama", seed=1)
    new.save_pretrained(target)
    assert seen_during_save == [before]
    assert sorted(os.listdir(target)) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "runs",
        "tokenizer.json",
    ]
    assert (target / "runs" / "events").read_text() == "log" and (target / "tokenizer.json").read_text() == "{}"
    with torch.no_grad():
        torch.testing.assert_close(_logits(target), new(input_ids=torch.tensor([[3, 4, 5]])).logits)
    assert os.listdir(tmp_path) == ["ckpt"]


def test_every_written_file_and_the_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real(fd))
    make_model("llama").save_pretrained(tmp_path / "ckpt", max_shard_size="30KB")
    names = set(os.listdir(tmp_path / "ckpt"))
    synced_names = {os.path.basename(p) for p in synced}
    assert all(any(s.endswith(n) for s in synced_names) for n in names), (names, synced_names)
    # the staged directory itself, and its parent once it is renamed into place
    assert any(os.path.basename(s).startswith(".ckpt.saving-") for s in synced) and str(tmp_path) in synced


def test_only_the_main_process_writes(tmp_path):
    make_model("llama").save_pretrained(tmp_path / "rank1", is_main_process=False)
    assert not (tmp_path / "rank1").exists()
    make_model("llama").save_pretrained(tmp_path / "rank0", is_main_process=True)
    assert (tmp_path / "rank0" / "model.safetensors").is_file()


def test_saving_into_the_current_directory_or_through_a_symlink(tmp_path, monkeypatch):
    target = tmp_path / "ckpt"
    make_model("llama", seed=0).save_pretrained(target)
    monkeypatch.chdir(target)
    make_model("llama", seed=1).save_pretrained(".")
    assert os.getcwd() == str(target) and os.path.isfile("model.safetensors"), "the process still sits in ckpt/"
    (tmp_path / "link").symlink_to(target)
    make_model("llama", seed=2).save_pretrained(tmp_path / "link")
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "link"] and (tmp_path / "link").is_symlink()
    with torch.no_grad():
        expected = make_model("llama", seed=2)(input_ids=torch.tensor([[3, 4, 5]])).logits
    torch.testing.assert_close(_logits(target), expected)


# ---------------------------------------------------------------------- transformers' signature (issue 46, 3.2)
def _pair(tmp_path, **kw):
    """An hf-lite Llama and transformers' Llama with the same weights, in module order (transformers'
    from_pretrained leaves its state dict in another order, and the shard split follows the order)."""
    import transformers

    ours = make_model("llama", **kw)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**ours.config.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def test_save_pretrained_takes_transformers_signature_and_defaults():
    import inspect

    import transformers

    theirs = inspect.signature(transformers.PreTrainedModel.save_pretrained).parameters
    ours = inspect.signature(LlamaForCausalLM.save_pretrained).parameters
    for name, param in theirs.items():
        assert name in ours, name
        assert ours[name].default == param.default and ours[name].kind == param.kind, name
    # transformers 4's two, which the accelerate *_no_trainer scripts and older code pass (5.24 swallows them)
    assert ours["save_function"].default is torch.save and ours["safe_serialization"].default is True


def test_save_function_accelerator_save_as_the_no_trainer_scripts_pass(tmp_path):
    """run_clm_no_trainer.py's last line: save_pretrained(output_dir, is_main_process=..., save_function=
    accelerator.save). The same files as transformers' save, and each library loads the other's."""
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    ours, theirs = _pair(tmp_path)
    for name, model in (("ours", ours), ("theirs", theirs)):
        model.save_pretrained(tmp_path / name, is_main_process=accelerator.is_main_process,
                              save_function=accelerator.save)
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))
    import transformers

    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        expected = theirs(input_ids=ids).logits
        assert torch.equal(LlamaForCausalLM.from_pretrained(tmp_path / "theirs")(input_ids=ids).logits, expected)
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
        assert torch.equal(back(input_ids=ids).logits, expected)


def test_sharded_save_writes_transformers_files_and_index(tmp_path):
    """Shards split as transformers splits them (through huggingface_hub, an oversized tensor alone in its shard),
    and the index byte for byte (total_parameters, total_size, sorted weight_map)."""
    ours, theirs = _pair(tmp_path, vocab_size=800)  # the 800 x 32 fp32 embedding (102 KB) is over the limit
    for limit in ("30KB", "120KB"):
        ours.save_pretrained(tmp_path / f"ours{limit}", max_shard_size=limit)
        theirs.save_pretrained(tmp_path / f"theirs{limit}", max_shard_size=limit)
        names = sorted(os.listdir(tmp_path / f"ours{limit}"))
        assert names == sorted(os.listdir(tmp_path / f"theirs{limit}")) and "model.safetensors.index.json" in names
        index = "model.safetensors.index.json"
        assert (tmp_path / f"ours{limit}" / index).read_text() == (tmp_path / f"theirs{limit}" / index).read_text()
        for shard in (n for n in names if n.startswith("model-")):
            from safetensors import safe_open

            with safe_open(tmp_path / f"ours{limit}" / shard, "pt") as a, \
                    safe_open(tmp_path / f"theirs{limit}" / shard, "pt") as b:
                assert list(a.keys()) == list(b.keys()), shard


def test_safe_serialization_false_writes_bin_shards_through_save_function(tmp_path):
    import transformers

    calls = []

    def save_function(obj, path):
        calls.append((sorted(obj), os.path.basename(path)))
        torch.save(obj, path)

    ours, theirs = _pair(tmp_path)
    ours.save_pretrained(tmp_path / "bin", safe_serialization=False, save_function=save_function,
                         max_shard_size="30KB")
    shards = sorted(n for n in os.listdir(tmp_path / "bin") if n.startswith("pytorch_model-"))
    assert len(shards) > 1 and sorted(name for _, name in calls) == shards
    assert sorted(k for keys, _ in calls for k in keys) == sorted(ours.state_dict())
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bin", use_safetensors=False)
    for key, value in theirs.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key


def test_distributed_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="distributed_checkpoint=True"):
        make_model("llama").save_pretrained(tmp_path / "dcp", distributed_checkpoint=True)
