"""The OpenAI-compatible server, started on loopback in the test and driven by a real HTTP client (httpx).

Mirrors vLLM's tests/entrypoints/openai (test_completion.py, test_chat.py, test_basic.py, test_metrics.py):
results equal the offline engine's, streamed chunks concatenate to the non-streamed text, every bad request gets a
4xx with an OpenAI error body, overload answers 429, a disconnect frees its blocks, 50 concurrent requests finish.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import torch
from paged_serve import SamplingParams
from paged_serve.entrypoints.cli import make_parser

from .server_util import Server, sse_events


@pytest.fixture(scope="module")
def server(checkpoint):
    path, hf = checkpoint("llama")
    s = Server(path)
    s.hf = hf
    yield s
    s.close()


def _greedy_text(server, ids, n):
    with torch.no_grad():
        out = server.hf.generate(
            torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None
        )
    return server.engine.engine.tokenizer.decode(out[0, len(ids) :].tolist())


def test_completion_matches_transformers_and_stream_concatenates(server):
    tok = server.engine.engine.tokenizer
    prompt = "the quick brown fox"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()
    text = data["choices"][0]["text"]
    assert text == _greedy_text(server, tok.encode(prompt), 12)
    assert data["object"] == "text_completion" and data["choices"][0]["finish_reason"] == "length"
    assert data["usage"] == {
        "prompt_tokens": len(tok.encode(prompt)),
        "completion_tokens": 12,
        "total_tokens": len(tok.encode(prompt)) + 12,
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and len(events) > 3
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_completion_batch_of_prompts_logprobs_and_echo(server):
    body = {
        "prompt": ["the cat", "the dog"],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 2,
        "echo": True,
    }
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1] and choices[0]["text"].startswith("the cat")
    lp = choices[0]["logprobs"]
    tok = server.engine.engine.tokenizer
    prompt_ids = tok.encode("the cat")
    # echo + logprobs: the prompt tokens are scored too, the first has none (vLLM's prompt_logprobs)
    assert len(lp["tokens"]) == len(prompt_ids) + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][: len(prompt_ids)] == [tok.decode([t], skip_special_tokens=False) for t in prompt_ids]
    with torch.no_grad():
        ref = server.hf(torch.tensor([prompt_ids])).logits[0].float().log_softmax(-1)
    for i in range(1, len(prompt_ids)):
        assert abs(lp["token_logprobs"][i] - ref[i - 1, prompt_ids[i]].item()) < 1e-4
    scored = list(zip(lp["top_logprobs"], lp["token_logprobs"]))[len(prompt_ids) :]
    assert all(v <= 0 for _, v in scored) and all(top and max(top.values()) == v for top, v in scored)
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        streamed = [e for e in sse_events(r)[:-1] if e["choices"]]
    echoed = next(e["choices"][0] for e in streamed if e["choices"][0]["index"] == 0)
    assert echoed["text"] == "the cat"
    assert echoed["logprobs"]["token_logprobs"][1:] == lp["token_logprobs"][1 : len(prompt_ids)]
    ids = httpx.post(f"{server.url}/v1/completions", json={"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 2}, timeout=30)
    assert ids.status_code == 200 and len(ids.json()["choices"]) == 2 and ids.json()["usage"]["prompt_tokens"] == 5


def test_chat_uses_the_template_and_streams(server):
    tok = server.engine.engine.tokenizer
    messages = [{"role": "user", "content": "the lazy dog"}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    assert tok.apply_chat_template(messages) == "<|user|>the lazy dog</s><|assistant|>"
    assert content == _greedy_text(server, ids, 10)
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
        events = sse_events(r)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant" and events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == content
    assert events[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "path,body,status,param",
    [
        ("/v1/completions", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 500}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": [5] * 200}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, None),
        ("/v1/completions", {"prompt": "x", "top_p": 2.0}, 400, None),
        ("/v1/completions", {"prompt": "x", "n": 2, "temperature": 0}, 400, None),
        ("/v1/completions", {"prompt": [5, 10_000]}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
        ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "logprobs": 1000}, 400, "logprobs"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
    ],
)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    r = httpx.post(f"{server.url}{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param or param in error["message"], error


def test_invalid_json_and_unknown_routes(server):
    r = httpx.post(f"{server.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/nope").status_code == 404


def test_models_health_metrics(server):
    assert httpx.get(f"{server.url}/health").status_code == 200
    models = httpx.get(f"{server.url}/v1/models").json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 128
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "the", "max_tokens": 3}, timeout=30)
    text = httpx.get(f"{server.url}/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_hit_rate",
        "vllm:num_preemptions_total",
        "vllm:avg_generation_throughput_toks_per_s",
    ):
        assert f'{name}{{model_name="tiny"}}' in text
    assert float(text.split('vllm:generation_tokens_total{model_name="tiny"} ')[1].split()[0]) >= 3


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    body = {"prompt": "the quick", "max_tokens": 100, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                break
    # the connection is closed here, long before 100 tokens
    assert server.idle(), "the aborted request still holds blocks"
    assert server.engine.engine.scheduler.block_manager.get_num_free_gpu_blocks() == 96


def test_fifty_concurrent_requests_all_complete(server):
    async def one(client, i):
        body = {
            "prompt": [3 + i % 50, 7, 9 + i % 7],
            "max_tokens": 8,
            "ignore_eos": True,
            "temperature": 0.8,
            "seed": i,
            "stream": i % 2 == 0,
        }
        if body["stream"]:
            async with client.stream("POST", "/v1/completions", json=body) as r:
                assert r.status_code == 200
                chunks = [
                    json.loads(x[6:]) for x in [line async for line in r.aiter_lines()] if x.startswith("data: {")
                ]
                return sum(len(c["choices"][0]["text"]) for c in chunks), chunks[-1]["choices"][0]["finish_reason"]
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return len(r.json()["choices"][0]["text"]), r.json()["choices"][0]["finish_reason"]

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(one(client, i) for i in range(50)))

    results = asyncio.run(main())
    assert len(results) == 50 and all(reason == "length" for _, reason in results)
    assert server.idle()


def test_overload_answers_429(checkpoint):
    path, _ = checkpoint("llama")
    s = Server(path, max_waiting_requests=2, max_num_seqs=1, max_num_batched_tokens=128)
    try:
        long = {"prompt": "the", "max_tokens": 120, "ignore_eos": True}

        async def main():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
                first = asyncio.ensure_future(client.post("/v1/completions", json=long))
                await asyncio.sleep(0.3)  # it is running; the next two wait, the rest overflow
                rest = await asyncio.gather(
                    *(client.post("/v1/completions", json={**long, "max_tokens": 2}) for _ in range(5))
                )
                return [(await first).status_code] + [r.status_code for r in rest], rest

        codes, rest = asyncio.run(main())
        assert codes[0] == 200 and codes.count(429) >= 1 and codes.count(200) >= 3
        over = next(r for r in rest if r.status_code == 429)
        assert over.json()["error"]["type"] == "rate_limit_exceeded"
        assert s.idle()
    finally:
        s.close()


def test_api_key_is_checked_on_every_request(checkpoint):
    path, _ = checkpoint("llama")
    s = Server(path, api_key="sesame")
    try:
        body = {"prompt": "the", "max_tokens": 2}
        assert httpx.post(f"{s.url}/v1/completions", json=body).status_code == 401
        bad = httpx.post(f"{s.url}/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{s.url}/v1/models").status_code == 401
        assert httpx.get(f"{s.url}/metrics").status_code == 401
        ok = httpx.post(f"{s.url}/v1/completions", json=body, headers={"Authorization": "Bearer sesame"}, timeout=30)
        assert ok.status_code == 200
        assert httpx.get(f"{s.url}/health").status_code == 200  # liveness probes need no key
    finally:
        s.close()


def test_cli_lists_every_engine_argument_and_binds_loopback():
    parser = make_parser()
    args = parser.parse_args(["serve", "/some/dir"])
    assert args.host == "127.0.0.1" and args.port == 8000 and args.block_size == 16
    help_text = parser._subparsers._group_actions[0].choices["serve"].format_help()
    for name in (
        "--num-gpu-blocks",
        "--preemption-mode",
        "--enable-prefix-caching",
        "--max-num-seqs",
        "--max-model-len",
        "--swap-space",
        "--api-key",
        "--max-waiting-requests",
    ):
        assert name in help_text
    assert SamplingParams  # the package's public import line stays vLLM's
