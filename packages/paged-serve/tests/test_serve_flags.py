"""``paged-serve serve`` takes the ``vllm serve`` flags users paste (vLLM ``entrypoints/openai/cli_args.py``): the
ones paged-serve implements reach the engine or the server, the ones that change nothing here are accepted with a
logged note, the rest are refused by name; the server command of vLLM's ``benchmarks/benchmark_serving.py``
docstring starts and serves."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from types import SimpleNamespace

import httpx
import pytest
from paged_serve import LLM, EngineArgs
from paged_serve._compat.openai.cli_args import VLLM_ONLY_FLAGS, check_vllm_only_args
from paged_serve._compat.openai.protocol import CompletionRequest
from paged_serve._compat.openai.serving_engine import OpenAIServing
from paged_serve.entrypoints.cli import make_parser
from transformers import AutoTokenizer

from .server_util import Server, start_server

ENV = {**os.environ, "TRITON_INTERPRET": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def _serve_args(*argv):
    return make_parser().parse_args(["serve", *argv])


def test_engine_flags_reach_engine_args(checkpoint):
    path, _ = checkpoint("llama")
    flags = ["--max-model-len", "128", "--dtype", "float32", "--seed", "3", "--swap-space", "16",
             "--gpu-memory-utilization", "0.5", "--enable-prefix-caching", "--tensor-parallel-size", "2"]  # fmt: skip
    engine_args = EngineArgs.from_cli_args(_serve_args(path, *flags))
    assert (engine_args.max_model_len, engine_args.dtype, engine_args.seed) == (128, "float32", 3)
    assert engine_args.swap_space == 16.0
    assert engine_args.gpu_memory_utilization == 0.5 and engine_args.enable_prefix_caching
    assert engine_args.tensor_parallel_size == 2
    assert EngineArgs.from_cli_args(_serve_args(path, "-tp", "2")).tensor_parallel_size == 2
    assert EngineArgs.from_cli_args(_serve_args(path)).tensor_parallel_size == 1
    hub = EngineArgs.from_cli_args(_serve_args("org/name", "--revision", "v2", "--download-dir", "/d",
                                               "--tokenizer-revision", "t", "--generation-config", "vllm",
                                               "--override-generation-config", '{"temperature": 0.5}'))  # fmt: skip
    assert (hub.model, hub.revision, hub.download_dir, hub.tokenizer_revision) == ("org/name", "v2", "/d", "t")
    assert hub.generation_config == "vllm" and hub.override_generation_config == {"temperature": 0.5}
    args = _serve_args(path, "--served-model-name", "a", "b", "--disable-log-requests", "--api-key", "k")
    assert args.served_model_name == ["a", "b"] and args.disable_log_requests and args.api_key == "k"


@pytest.mark.parametrize(
    "argv",
    [["--disable-log-stats"], ["--enforce-eager"], ["--trust-remote-code"], ["--kv-cache-dtype", "auto"],
     ["--pipeline-parallel-size", "1"], ["--uvicorn-log-level", "debug"], ["--load-format", "safetensors"],
     ["--scheduling-policy", "fcfs"], ["--max-log-len", "100"]],
)  # fmt: skip
def test_vllm_flags_that_change_nothing_here_are_accepted_with_a_note(argv, caplog):
    args = _serve_args("m", *argv)
    with caplog.at_level(logging.INFO, logger="paged_serve._compat.openai.cli_args"):
        check_vllm_only_args(args)
    (note,) = [r.getMessage() for r in caplog.records]
    assert note.startswith(" ".join(argv)) and "accepted with no effect" in note


@pytest.mark.parametrize(
    "argv",
    [["--enable-lora"], ["--quantization", "awq"], ["--kv-cache-dtype", "fp8"], ["--pipeline-parallel-size", "2"],
     ["--speculative-config", "{}"], ["--enable-auto-tool-choice"], ["--ssl-keyfile", "k.pem"],
     ["--scheduling-policy", "priority"], ["--hf-overrides", "{}"]],
)  # fmt: skip
def test_vllm_flags_paged_serve_lacks_are_refused_by_name(argv):
    with pytest.raises(SystemExit, match=f"paged-serve: {' '.join(argv)} is not supported: "):
        check_vllm_only_args(_serve_args("m", *argv))


def test_llm_takes_the_same_vllm_arguments_as_keywords(checkpoint, caplog):
    """``LLM(model, enforce_eager=True, trust_remote_code=True, ...)`` as vLLM's scripts write it."""
    path, _ = checkpoint("llama")
    with caplog.at_level(logging.INFO, logger="paged_serve._compat.openai.cli_args"):
        LLM(path, num_gpu_blocks=32, enforce_eager=True, trust_remote_code=True, quantization=None,
            cpu_offload_gb=0.0, pipeline_parallel_size=1, enable_lora=False)  # fmt: skip
    notes = sorted(r.getMessage().split("=")[0] for r in caplog.records)
    assert notes == ["cpu_offload_gb", "enforce_eager", "pipeline_parallel_size", "trust_remote_code"]
    for kwargs in ({"quantization": "awq"}, {"enable_lora": True}, {"kv_cache_dtype": "fp8"}):
        (name,) = kwargs
        with pytest.raises(ValueError, match=f"{name}=.* is not supported: "):
            LLM(path, **kwargs)
    with pytest.raises(TypeError, match="unknown engine argument.*no_such_argument"):
        LLM(path, no_such_argument=1)


def test_a_flag_vllm_does_not_have_either_is_argparse_s_error(capsys):
    with pytest.raises(SystemExit) as exc:
        _serve_args("m", "--no-such-flag")
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    assert not set(VLLM_ONLY_FLAGS) & {"--served-model-name", "--api-key", "--chat-template", "--max-model-len"}


def test_disable_log_requests_silences_the_per_request_line(caplog):
    model_config = SimpleNamespace(get_diff_sampling_param=dict)
    scheduler_config = SimpleNamespace(max_model_len=8)
    fake = SimpleNamespace(engine=SimpleNamespace(tokenizer=None, scheduler_config=scheduler_config,
                                                  model_config=model_config))  # fmt: skip
    request = CompletionRequest(model="m", prompt="hi", max_tokens=3)
    for log_requests, lines in ((True, 1), (False, 0)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="paged_serve._compat.openai.serving_engine"):
            OpenAIServing(fake, "m", log_requests).log_request(request, "cmpl-1")
        assert len([r for r in caplog.records if "received request cmpl-1" in r.getMessage()]) == lines


def test_benchmark_serving_server_command_starts_with_the_pasted_flags(checkpoint, tmp_path):
    """``vllm serve <your_model> --swap-space 16 --disable-log-requests`` (benchmark_serving.py's docstring), plus
    the server flags users add: two served names, a chat template file, an API key, a no-op flag."""
    path, _ = checkpoint("llama")
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}## {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}## assistant:")
    args = [path, "--swap-space", "16", "--disable-log-requests", "--served-model-name", "first", "second",
            "--chat-template", str(template), "--api-key", "sesame", "--disable-log-stats", "--max-model-len", "128",
            "--num-gpu-blocks", "64", "--log-level", "info"]  # fmt: skip
    server, url = start_server(args, ENV)
    auth = {"Authorization": "Bearer sesame"}
    try:
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert [m["id"] for m in httpx.get(f"{url}/v1/models", headers=auth).json()["data"]] == ["first", "second"]
        messages = [{"role": "user", "content": "the lazy dog"}]
        body = {"model": "second", "messages": messages, "max_tokens": 2, "temperature": 0}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=60)
        assert reply.status_code == 200 and reply.json()["model"] == "first"
        rendered = AutoTokenizer.from_pretrained(path).apply_chat_template(
            messages, chat_template=template.read_text(), tokenize=False, add_generation_prompt=True
        )
        ids = AutoTokenizer.from_pretrained(path)(rendered, add_special_tokens=False).input_ids
        assert reply.json()["usage"]["prompt_tokens"] == len(ids)
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=30)
        err = server.stderr.read()
    assert rc == 0, err[-3000:]
    assert "--disable-log-stats accepted with no effect" in err
    assert "received request" not in err  # --disable-log-requests


def test_the_server_takes_what_a_request_leaves_out_from_the_generation_config(checkpoint, tmp_path):
    """vLLM's serving classes: temperature, top_p, top_k, min_p, repetition_penalty a request does not give come
    from the model's generation_config.json, and so does max_tokens when a chat request gives none."""
    path, _ = checkpoint("llama")
    model = tmp_path / "model"
    shutil.copytree(path, model)
    (model / "generation_config.json").write_text(json.dumps({"top_k": 1, "max_new_tokens": 3, "temperature": 0.9}))
    server = Server(str(model))
    try:
        messages = [{"role": "user", "content": "the lazy dog"}]
        body = {"messages": messages, "seed": 1, "ignore_eos": True}
        first = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
        assert first["usage"]["completion_tokens"] == 3  # max_new_tokens
        greedy = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "temperature": 0}, timeout=60).json()
        assert first["choices"][0]["message"] == greedy["choices"][0]["message"]  # top_k=1 is greedy
        sampled = set()
        for seed in range(4):  # the request's own top_k wins over the model's: sampling, not greedy
            body = {**body, "top_k": -1, "seed": seed, "max_tokens": 8}
            reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
            sampled.add(reply["choices"][0]["message"]["content"])
        assert len(sampled) > 1
    finally:
        server.close()
