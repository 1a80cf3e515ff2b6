"""benchmarks/bench_serving_client.py, the client of vLLM's serving benchmark (benchmark_serving.py with
backend_request_func.py) rebuilt, against paged-serve's server: the three backends' requests succeed, every
streamed text is the server's unstreamed answer, failures are counted with their reason, and the metrics agree
with each other."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from .server_util import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_serving_client as client  # noqa: E402

PROMPTS = [("the quick brown fox", 4), ("jumps over the lazy dog", 5), ("hello", 1), ("a b c d e f", 6)]
OUTPUT_LEN = 6


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    path, _ = checkpoint("llama")
    model = tmp_path_factory.mktemp("bench-client") / "model"
    shutil.copytree(path, model)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = client.CHAT_TEMPLATE
    tok.save_pretrained(model)
    server = Server(str(model), max_model_len=64)
    yield server
    server.close()


@pytest.mark.parametrize("backend", ["vllm", "openai", "openai-chat"])
def test_each_backend_streams_the_servers_answer_and_counts_it(server, backend):
    outputs, duration = asyncio.run(client.benchmark(server.url, backend, "tiny", PROMPTS, OUTPUT_LEN,
                                                     max_concurrency=2, progress=False))
    got = client.metrics(outputs, duration)
    assert (got["completed"], got["failed"]) == (len(PROMPTS), 0), [o.error for o in outputs]
    assert got["total_output_tokens"] == len(PROMPTS) * OUTPUT_LEN
    assert got["total_input_tokens"] == sum(n for _, n in PROMPTS)
    route, _ = client.request_body(backend, "tiny", "x", 1)
    for (prompt, _), out in zip(PROMPTS, outputs):
        _, body = client.request_body(backend, "tiny", prompt, OUTPUT_LEN)
        body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        whole = httpx.post(server.url + route, json=body, timeout=60).json()["choices"][0]
        assert out.generated_text == (whole["text"] if "text" in whole else whole["message"]["content"])
        assert 0 < out.ttft <= out.latency  # (chat holds a split character's bytes back: maybe one chunk only)
        assert len(out.itl) <= OUTPUT_LEN - 1
    assert got["median_ttft_ms"] <= got["median_e2el_ms"] and got["p99_ttft_ms"] <= 1000 * duration
    assert got["request_throughput"] == pytest.approx(len(PROMPTS) / duration)
    assert got["mean_tpot_ms"] > 0


def test_a_refused_request_is_counted_failed_with_the_servers_reason(server):
    too_long = (" ".join(["dog"] * 80), 80)  # over max_model_len 64
    outputs, duration = asyncio.run(client.benchmark(server.url, "openai", "tiny", [PROMPTS[0], too_long],
                                                     OUTPUT_LEN, request_rate=50.0, progress=False))
    got = client.metrics(outputs, duration)
    assert (got["completed"], got["failed"]) == (1, 1)
    assert outputs[1].error.startswith("HTTP 400") and "64" in outputs[1].error


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="'tgi'"):
        client.request_body("tgi", "m", "p", 1)
