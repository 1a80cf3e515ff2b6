"""Hub names: ``from_pretrained("org/name", revision=, subfolder=, local_files_only=, cache_dir=, token=)`` for
configs, models, tokenizers and generation configs, resolved through ``huggingface_hub`` (``_infra/hub.py``) as
transformers' ``utils/hub.py`` (``cached_file`` / ``cached_files``) resolves them.

The cache is built in ``tmp_path`` in huggingface_hub's own layout (``models--org--name/refs/<ref>``,
``snapshots/<sha>/...`` symlinks into ``blobs/``) from checkpoints transformers saved, and both libraries load the
same names from it with ``HF_HUB_CACHE`` / ``HF_HUB_OFFLINE=1`` set. Downloading is checked by standing in for
``hf_hub_download`` (nothing here reaches a network). Mirrors transformers' ``tests/utils/test_hub_utils.py``
(cached files, revisions, subfolders, offline errors) and the hub cases of ``tests/utils/test_modeling_utils.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys

import huggingface_hub
import pytest
import torch
import transformers
from hf_lite import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
from hf_lite._infra import hub
from hf_lite.utils.hub import cached_file
from hf_lite_testing import tiny_llama_config
from huggingface_hub.errors import EntryNotFoundError

REPO = "tiny-org/tiny-llama"
SHA_A, SHA_B = "a" * 40, "b" * 40
PROMPTS = ["def f(x):", "import os\nprint(os.getcwd())"]


def add_snapshot(cache: str, repo_id: str, sha: str, source_dir: str, refs=("main",), subfolder: str = "") -> None:
    """Put ``source_dir``'s files into ``cache`` as huggingface_hub stores a downloaded commit ``sha``."""
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    for root, _, files in os.walk(source_dir):
        for name in files:
            data = open(os.path.join(root, name), "rb").read()
            blob = os.path.join(repo, "blobs", hashlib.sha256(data).hexdigest())
            os.makedirs(os.path.dirname(blob), exist_ok=True)
            with open(blob, "wb") as f:
                f.write(data)
            rel = os.path.join(subfolder, os.path.relpath(os.path.join(root, name), source_dir))
            link = os.path.join(repo, "snapshots", sha, rel)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    for ref in refs:
        with open(os.path.join(repo, "refs", ref), "w") as f:
            f.write(sha)


def transformers_checkpoint(directory, tokenizer_dir: str, seed: int, dtype=torch.float32, **save_kwargs) -> str:
    """A tiny Llama and its tokenizer, written by transformers."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**tiny_llama_config(vocab_size=800).to_dict())
    transformers.LlamaForCausalLM(config).to(dtype).save_pretrained(directory, **save_kwargs)
    transformers.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(directory)
    return str(directory)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty hub cache in tmp_path, named by HF_HUB_CACHE, with HF_HUB_OFFLINE=1 (huggingface_hub reads both at
    import, so its constants are set too; transformers and hf-lite both read them there)."""
    cache = str(tmp_path / "hub-cache")
    os.makedirs(cache)
    monkeypatch.setenv("HF_HUB_CACHE", cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", cache)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def logits_both(name: str, **kwargs):
    ours = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(name, **kwargs).eval()
    tok, their_tok = AutoTokenizer.from_pretrained(name, **kwargs), transformers.AutoTokenizer.from_pretrained(name,
                                                                                                          **kwargs)
    tok.pad_token = their_tok.pad_token = "<pad>"
    batch, their_batch = tok(PROMPTS, padding=True, return_tensors="pt"), their_tok(PROMPTS, padding=True,
                                                                                   return_tensors="pt")
    assert batch["input_ids"].tolist() == their_batch["input_ids"].tolist()
    with torch.no_grad():
        mine, other = ours(**batch).logits, theirs(**their_batch).logits
    mask = batch["attention_mask"].bool()
    return ours, mine[mask], other[mask]


def test_hub_name_loads_from_the_offline_cache_like_transformers(tmp_path, offline_cache, trained_tokenizer_dir):
    add_snapshot(offline_cache, REPO, SHA_A, transformers_checkpoint(tmp_path / "ckpt", trained_tokenizer_dir, 0))
    model, mine, theirs = logits_both(REPO)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    snapshot = os.path.join(offline_cache, "models--tiny-org--tiny-llama", "snapshots", SHA_A)
    assert cached_file(REPO, "config.json") == os.path.join(snapshot, "config.json")
    config = AutoConfig.from_pretrained(REPO)
    assert isinstance(config, LlamaConfig) and config.to_dict() == model.config.to_dict() | {"dtype": "float32"}
    their_gen = transformers.GenerationConfig.from_pretrained(REPO)
    gen = GenerationConfig.from_pretrained(REPO)
    assert (gen.bos_token_id, gen.eos_token_id) == (their_gen.bos_token_id, their_gen.eos_token_id)
    assert LlamaConfig.from_pretrained(REPO).hidden_size == 32  # the model classes' own from_pretrained too
    assert LlamaForCausalLM.from_pretrained(REPO).config.num_hidden_layers == 2


def test_revision_by_commit_sha_and_by_ref_like_transformers(tmp_path, offline_cache, trained_tokenizer_dir):
    add_snapshot(offline_cache, REPO, SHA_A, transformers_checkpoint(tmp_path / "a", trained_tokenizer_dir, 0))
    add_snapshot(offline_cache, REPO, SHA_B, transformers_checkpoint(tmp_path / "b", trained_tokenizer_dir, 1),
                 refs=("v2",))
    outputs = {}
    for revision in (None, "main", SHA_A, "v2", SHA_B):
        _, mine, theirs = logits_both(REPO, revision=revision)
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
        outputs[revision] = mine
    assert torch.equal(outputs[None], outputs["main"]) and torch.equal(outputs["main"], outputs[SHA_A])
    assert torch.equal(outputs["v2"], outputs[SHA_B]) and not torch.allclose(outputs[SHA_A], outputs[SHA_B])
    with pytest.raises(OSError, match="We couldn't connect") as ours:
        AutoConfig.from_pretrained(REPO, revision="v3")  # a ref the cache does not have
    with pytest.raises(OSError) as theirs:
        transformers.AutoConfig.from_pretrained(REPO, revision="v3")
    assert str(theirs.value) in str(ours.value)


def test_subfolder_of_a_hub_repo_like_transformers(tmp_path, offline_cache, trained_tokenizer_dir):
    add_snapshot(offline_cache, REPO, SHA_A, transformers_checkpoint(tmp_path / "ckpt", trained_tokenizer_dir, 0),
                 subfolder="base")
    _, mine, theirs = logits_both(REPO, subfolder="base")
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert AutoConfig.from_pretrained(REPO, subfolder="base").num_attention_heads == 4
    with pytest.raises(OSError, match="does not appear to have a file named config.json"):
        AutoConfig.from_pretrained(REPO)  # the repo's root has no config.json


def test_sharded_bf16_checkpoint_by_hub_name_loads_in_bf16_with_dtype_auto(tmp_path, offline_cache,
                                                                          trained_tokenizer_dir):
    source = transformers_checkpoint(tmp_path / "ckpt", trained_tokenizer_dir, 0, dtype=torch.bfloat16,
                                     max_shard_size="20KB")
    shards = [f for f in os.listdir(source) if f.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors.index.json" in os.listdir(source)
    add_snapshot(offline_cache, REPO, SHA_A, source)
    ours = AutoModelForCausalLM.from_pretrained(REPO, dtype="auto")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(REPO, dtype="auto")
    assert ours.dtype == theirs.dtype == torch.bfloat16 and ours.config.dtype == torch.bfloat16
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert AutoModelForCausalLM.from_pretrained(REPO, torch_dtype=torch.float32).dtype == torch.float32
    # no dtype: transformers 5 loads as the checkpoint's ("auto"), and so does hf-lite
    assert AutoModelForCausalLM.from_pretrained(REPO).dtype == transformers.AutoModelForCausalLM.from_pretrained(
        REPO).dtype == torch.bfloat16
    assert json.loads(open(cached_file(REPO, "config.json")).read())["dtype"] == "bfloat16"  # as transformers 5 writes


def test_offline_missing_name_raises_transformers_error_naming_the_name(offline_cache):
    name = "someone/never-downloaded"
    loaders = [
        (AutoConfig.from_pretrained, transformers.AutoConfig.from_pretrained),
        (AutoModelForCausalLM.from_pretrained, transformers.AutoModelForCausalLM.from_pretrained),
        (LlamaForCausalLM.from_pretrained, transformers.LlamaForCausalLM.from_pretrained),
        (AutoTokenizer.from_pretrained, transformers.AutoTokenizer.from_pretrained),
        (GenerationConfig.from_pretrained, transformers.GenerationConfig.from_pretrained),
    ]
    for ours, theirs in loaders:
        with pytest.raises(OSError) as their_error:
            theirs(name)
        with pytest.raises(OSError) as our_error:
            ours(name)
        assert type(our_error.value) is type(their_error.value)
        assert str(their_error.value) in str(our_error.value) and repr(name) in str(our_error.value)
        assert "We couldn't connect to 'https://huggingface.co'" in str(our_error.value)


def test_local_files_only_reads_the_cache_without_offline_mode(tmp_path, monkeypatch, trained_tokenizer_dir):
    cache = str(tmp_path / "cache")
    add_snapshot(cache, REPO, SHA_A, transformers_checkpoint(tmp_path / "ckpt", trained_tokenizer_dir, 0))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []
    real = hub.hf_hub_download
    monkeypatch.setattr(hub, "hf_hub_download", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    _, mine, theirs = logits_both(REPO, cache_dir=cache, local_files_only=True)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert calls and all(c["local_files_only"] and c["cache_dir"] == cache for c in calls)
    with pytest.raises(OSError, match="'someone/else' is not a local directory") as ours:
        AutoConfig.from_pretrained("someone/else", cache_dir=cache, local_files_only=True)
    with pytest.raises(OSError) as theirs:
        transformers.AutoConfig.from_pretrained("someone/else", cache_dir=cache, local_files_only=True)
    assert str(theirs.value) in str(ours.value)


def test_download_goes_through_hf_hub_download(tmp_path, monkeypatch, trained_tokenizer_dir):
    """Online: every file comes from ``huggingface_hub.hf_hub_download`` (here a stand-in serving a local repo
    into the cache as the real one does) with the repo id, file name, revision, cache dir and token; a file the repo
    does not have is its ``EntryNotFoundError``, which optional files (generation_config.json, a .bin) may raise."""
    served = transformers_checkpoint(tmp_path / "remote", trained_tokenizer_dir, 0, max_shard_size="30KB")
    os.remove(os.path.join(served, "generation_config.json"))
    cache = str(tmp_path / "cache")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    calls = []

    def fake_hf_hub_download(repo_id, filename, *, subfolder=None, revision=None, cache_dir=None, token=None,
                             local_files_only=False, force_download=False, **kwargs):
        calls.append(dict(repo_id=repo_id, filename=filename, revision=revision, cache_dir=cache_dir, token=token,
                          force_download=force_download))
        source = os.path.join(served, subfolder or "", filename)
        if not os.path.isfile(source):
            raise EntryNotFoundError(f"{filename} is not in {repo_id}")
        target = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"), "snapshots", SHA_A, filename)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(source, target)
        return target

    monkeypatch.setattr(hub, "hf_hub_download", fake_hf_hub_download)
    model = AutoModelForCausalLM.from_pretrained(REPO, revision="main", cache_dir=cache, token="hf_secret",
                                                 force_download=True)
    their_model = transformers.AutoModelForCausalLM.from_pretrained(served)
    for key, value in their_model.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    fetched = {c["filename"] for c in calls}
    shards = {f for f in os.listdir(served) if f.startswith("model-")}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json"} | shards <= fetched
    assert "pytorch_model.bin" not in fetched  # the first weight format found ends the search, as in transformers
    assert all(c["repo_id"] == REPO and c["revision"] == "main" and c["cache_dir"] == cache
               and c["token"] == "hf_secret" and c["force_download"] for c in calls)
    calls.clear()
    tok = AutoTokenizer.from_pretrained(REPO, cache_dir=cache, token="hf_secret")
    assert tok(PROMPTS[0])["input_ids"] == transformers.AutoTokenizer.from_pretrained(served)(PROMPTS[0])["input_ids"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= {c["filename"] for c in calls}


def test_hf_home_and_hf_hub_offline_from_the_environment(tmp_path, trained_tokenizer_dir):
    """A fresh process with only ``HF_HOME`` and ``HF_HUB_OFFLINE=1`` in its environment finds the name under
    ``$HF_HOME/hub`` and loads the same model transformers loads there."""
    home = tmp_path / "hf-home"
    add_snapshot(str(home / "hub"), REPO, SHA_A, transformers_checkpoint(tmp_path / "ckpt", trained_tokenizer_dir, 0))
    code = (
        "import torch, transformers, hf_lite\n"
        f"ids = torch.tensor([[5, 6, 7, 8]])\n"
        f"ours = hf_lite.AutoModelForCausalLM.from_pretrained({REPO!r})(input_ids=ids).logits\n"
        f"theirs = transformers.AutoModelForCausalLM.from_pretrained({REPO!r})(input_ids=ids).logits\n"
        "torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)\n"
        f"assert hf_lite.AutoTokenizer.from_pretrained({REPO!r}).model_max_length > 0\n"
        "print('loaded from', hf_lite.utils.hub.cached_file(" + repr(REPO) + ", 'config.json'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"loaded from {home / 'hub'}" in done.stdout


def test_cached_file_answers_as_transformers_cached_file(tmp_path, offline_cache, trained_tokenizer_dir):
    from transformers.utils import hub as their_hub

    local = transformers_checkpoint(tmp_path / "ckpt", trained_tokenizer_dir, 0)
    add_snapshot(offline_cache, REPO, SHA_A, local)
    for name in (local, REPO):
        assert cached_file(name, "config.json") == their_hub.cached_file(name, "config.json")
        assert cached_file(name, "nope.json", _raise_exceptions_for_missing_entries=False) is None
        assert their_hub.cached_file(name, "nope.json", _raise_exceptions_for_missing_entries=False) is None
    with pytest.raises(OSError) as ours:
        cached_file(local, "nope.json")
    with pytest.raises(OSError) as theirs:
        their_hub.cached_file(local, "nope.json")
    assert str(ours.value) == str(theirs.value)  # "... does not appear to have a file named nope.json. Checkout ..."
    # a file the cached snapshot lacks, offline: hf-lite says the repo lacks it; transformers, that it cannot connect
    with pytest.raises(OSError, match=f"{REPO} does not appear to have a file named nope.json"):
        cached_file(REPO, "nope.json")
