"""Hub names (``LLM("org/name")``, ``EngineArgs(revision=, download_dir=, tokenizer=, tokenizer_revision=)``,
``serve org/name``) resolve through huggingface_hub as vLLM's loaders do (``_infra/hub.py``): from a cache in
huggingface_hub's layout that transformers reads too, offline; the download path with the download function
replaced (the network is unreachable here)."""

from __future__ import annotations

import os
import signal

import httpx
import huggingface_hub
import pytest
import torch
from paged_serve import LLM, EngineArgs, SamplingParams
from transformers import AutoModelForCausalLM

from .hub_cache import add_to_hub_cache
from .server_util import start_server

SHA_A, SHA_B, SHA_T = "a" * 40, "b" * 40, "c" * 40
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPT = "the quick brown fox"


@pytest.fixture
def hub(checkpoint, tmp_path, monkeypatch):
    """A cache with org/tiny at two commits (main -> A, tag v2 -> B: different weights) and a tokenizer-only
    repo org/tok; HF_HUB_CACHE points at it and HF_HUB_OFFLINE is set."""
    cache = tmp_path / "hub"
    path_a, _ = checkpoint("llama")
    path_b, _ = checkpoint("llama", seed=1)
    add_to_hub_cache(cache, "org/tiny", path_a, SHA_A, refs=("main",))
    add_to_hub_cache(cache, "org/tiny", path_b, SHA_B, refs=("v2",))
    add_to_hub_cache(cache, "org/tok", path_a, SHA_T, files={"tokenizer.json", "tokenizer_config.json"})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _tokens(llm) -> list[int]:
    return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def _transformers_tokens(cache, revision, ids) -> list[int]:
    """What transformers generates greedily from the same name and revision in the same cache."""
    model = AutoModelForCausalLM.from_pretrained("org/tiny", revision=revision, cache_dir=cache, local_files_only=True)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def test_a_hub_name_loads_from_the_cache_by_ref_and_by_sha_as_transformers_does(hub):
    llm = LLM("org/tiny", num_gpu_blocks=32)
    assert llm.llm_engine.model_config.model == str(hub / "models--org--tiny" / "snapshots" / SHA_A)
    assert llm.llm_engine.model_config.model == huggingface_hub.snapshot_download(
        "org/tiny", cache_dir=hub, local_files_only=True
    )  # huggingface_hub reads the test's cache the same way
    ids = llm.get_tokenizer().encode(PROMPT)
    main = _tokens(llm)
    assert main == _transformers_tokens(hub, "main", ids)
    v2 = _tokens(LLM("org/tiny", revision="v2", num_gpu_blocks=32))
    assert v2 == _transformers_tokens(hub, "v2", ids) and v2 != main  # another commit, other weights
    assert _tokens(LLM("org/tiny", revision=SHA_B, num_gpu_blocks=32)) == v2
    assert _tokens(LLM("org/tiny", revision=SHA_A, num_gpu_blocks=32)) == main


def test_download_dir_hf_home_and_a_tokenizer_by_hub_name(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    config = EngineArgs("org/tiny", download_dir=str(hub), num_gpu_blocks=32).create_engine_config().model_config
    assert config.model.endswith(SHA_A)
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # the cache is HF_HOME/hub
    llm = LLM("org/tiny", tokenizer="org/tok", tokenizer_revision="main", num_gpu_blocks=32)
    assert llm.llm_engine.model_config.tokenizer == str(hub / "models--org--tok" / "snapshots" / SHA_T)
    assert llm.get_tokenizer().encode(PROMPT) == LLM("org/tiny", num_gpu_blocks=32).get_tokenizer().encode(PROMPT)
    config = EngineArgs("org/tiny", revision="v2", tokenizer_revision="main").create_engine_config().model_config
    assert config.model.endswith(SHA_B) and config.tokenizer.endswith(SHA_A)  # the model's repo, another revision


def test_generation_config_by_hub_name(hub, tmp_path):
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "generation_config.json").write_text('{"temperature": 0.3, "max_new_tokens": 9}')
    add_to_hub_cache(hub, "org/gen", gen, "e" * 40)
    llm = LLM("org/tiny", generation_config="org/gen", num_gpu_blocks=32)
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.max_tokens) == (0.3, 9)


def test_a_name_neither_local_nor_cached_while_offline_is_an_error_naming_it(hub):
    with pytest.raises(OSError, match=r"'org/missing' \(revision main\) is neither a local directory nor in the "
                                      r"Hugging Face cache .*HF_HUB_OFFLINE"):  # fmt: skip
        LLM("org/missing")
    with pytest.raises(OSError, match=r"'org/tiny' \(revision v9\)"):
        LLM("org/tiny", revision="v9")
    with pytest.raises(OSError, match=r"'org/tok'.*tokenizer.json"):
        LLM("org/tiny", tokenizer="org/tok", tokenizer_revision="v9")
    with pytest.raises(ValueError, match=r"model '/no/such/dir' is not a directory and not a Hugging Face hub name"):
        EngineArgs("/no/such/dir")


def test_online_a_missing_name_is_downloaded_with_vllm_s_patterns(hub, checkpoint, tmp_path, monkeypatch):
    """Not cached and online: one ``snapshot_download(repo_id, revision, cache_dir, allow_patterns)``; the engine
    loads what it returns. A cached name is never downloaded again."""
    calls = []
    path, _ = checkpoint("llama")

    def fake_snapshot_download(**kwargs):
        calls.append(kwargs)
        return str(add_to_hub_cache(kwargs["cache_dir"], kwargs["repo_id"], path, "d" * 40, refs=("r1",)))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    downloads = tmp_path / "downloads"
    llm = LLM("org/new", revision="r1", download_dir=str(downloads), num_gpu_blocks=32)
    (call,) = calls
    assert (call["repo_id"], call["revision"], call["cache_dir"]) == ("org/new", "r1", str(downloads))
    assert {"*.safetensors", "*.json"} <= set(call["allow_patterns"])
    assert call["ignore_patterns"] == ["original/**/*"]
    assert llm.llm_engine.model_config.model == str(downloads / "models--org--new" / "snapshots" / ("d" * 40))
    LLM("org/new", revision="r1", download_dir=str(downloads), num_gpu_blocks=32)
    LLM("org/tiny", num_gpu_blocks=32)
    assert len(calls) == 1  # both cached now


def test_hf_token_reaches_every_download_from_llm_engine_args_and_serve(hub, checkpoint, tmp_path, monkeypatch):
    """vLLM's ``hf_token`` (``LLM``, ``EngineArgs``, ``serve --hf-token [TOKEN]``) is the bearer token of the hub
    requests: a string as given, the flag alone ``True`` (huggingface_hub's saved login), absent ``None``; the model
    and the tokenizer downloads both carry it."""
    from paged_serve.entrypoints.cli import make_parser

    calls = []
    path, _ = checkpoint("llama")

    def fake_snapshot_download(**kwargs):
        calls.append(kwargs)
        sha = f"{len(calls):040d}"
        return str(add_to_hub_cache(kwargs["cache_dir"], kwargs["repo_id"], path, sha, refs=(f"r{len(calls)}",)))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    LLM("org/new", tokenizer="org/newtok", hf_token="hf_secret", download_dir=str(tmp_path / "a"), num_gpu_blocks=32)
    assert [(c["repo_id"], c["token"]) for c in calls] == [("org/new", "hf_secret"), ("org/newtok", "hf_secret")]
    for argv, want in ((["--hf-token", "hf_cli"], "hf_cli"), (["--hf-token"], True), ([], None)):
        calls.clear()
        args = make_parser().parse_args(["serve", "org/other", "--download-dir", str(tmp_path / str(want)), *argv])
        assert args.hf_token == want
        EngineArgs.from_cli_args(args).create_engine_config()
        assert [(c["repo_id"], c["token"]) for c in calls] == [("org/other", want)]


def test_a_failed_download_names_the_model(hub, monkeypatch):
    def unreachable(**kwargs):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(OSError, match=r"could not download 'org/other' \(revision main\): network is unreachable"):
        LLM("org/other")


def test_serve_a_hub_name_from_the_cache(hub):
    env = {**os.environ, "TRITON_INTERPRET": "1", "TOKENIZERS_PARALLELISM": "false"}  # the fixture's HF_* too
    server, url = start_server(["org/tiny", "--revision", "v2", "--num-gpu-blocks", "64", "--log-level", "warning"],
                               env)  # fmt: skip
    try:
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["org/tiny"]
        body = {"model": "org/tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        want = LLM("org/tiny", revision="v2", num_gpu_blocks=32).generate([PROMPT], GREEDY, use_tqdm=False)[0]
        assert reply["choices"][0]["text"] == want.outputs[0].text
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=30)
    assert rc == 0
