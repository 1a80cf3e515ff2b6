"""The server's failure behaviour as real clients meet it (the ``openai`` package, raw HTTP): every request gets a
status that says what happened, nothing a client sends can wedge the engine, and a client that leaves is aborted.

Ports vLLM's ``tests/entrypoints/openai/test_completion.py`` / ``test_chat.py`` error cases (seed range, n too
large, streaming errors), ``test_basic.py`` (404s, ``/v1/models``), ``test_api_key`` cases of ``test_serving``
and the shutdown tests of ``tests/entrypoints/openai/test_shutdown.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from paged_serve.entrypoints.cli import main as cli_main

from .server_util import Server, sse_events


@pytest.fixture(scope="module")
def server(checkpoint):
    path, _ = checkpoint("llama")
    s = Server(path, max_num_seqs=8, num_gpu_blocks=40, max_request_bytes=256 * 1024)
    yield s
    s.close()


def _error(r, status):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


def test_n_above_max_num_seqs_is_a_400_and_the_queue_keeps_moving(server):
    body = {"prompt": "the", "max_tokens": 4, "n": 9, "temperature": 1.0}
    error = _error(httpx.post(f"{server.url}/v1/completions", json=body, timeout=30), 400)
    assert "max_num_seqs=8" in error["message"]
    error = _error(httpx.post(f"{server.url}/v1/completions", json={**body, "n": 2, "best_of": 9}, timeout=30), 400)
    ok = httpx.post(f"{server.url}/v1/completions", json={**body, "n": 2}, timeout=30)
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2
    assert server.idle_and_free()


def test_a_group_the_pool_can_never_hold_together_ends_as_vllm_ends_it(server):
    """8 x 100 tokens on 40 blocks of 16: vLLM accepts it; the scheduler swaps the group out and, when it can no
    longer come back, ignores it: a 200 whose choices end "length", short of max_tokens, every block freed."""
    body = {"prompt": "the", "max_tokens": 100, "n": 8, "temperature": 1.0, "ignore_eos": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 8 and all(c["finish_reason"] == "length" for c in choices)
    assert r.json()["usage"]["completion_tokens"] < 8 * 100
    assert server.idle_and_free()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_requests_that_fail_before_the_first_token_get_a_real_status(server, route):
    base = {"max_tokens": 4, "stream": True}
    base.update({"prompt": "the"} if "chat" not in route else {"messages": [{"role": "user", "content": "the"}]})
    for extra, status, param in (
        ({"seed": 2**63}, 400, "seed"),
        ({"logit_bias": {"100000": 5}}, 400, None),
        ({"temperature": 2.5}, 400, "temperature"),
    ):
        with httpx.stream("POST", f"{server.url}{route}", json={**base, **extra}, timeout=30) as r:
            r.read()
            error = _error(r, status)
        assert param is None or error["param"] == param or param in error["message"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="seed"):
        client.completions.create(model="tiny", prompt="the", seed=-(2**63) - 1, stream=True)


def test_a_full_queue_is_a_429_for_streams_too(checkpoint):
    """One request running, one waiting (max_waiting_requests=1): a streamed completion and a streamed chat get
    the 429 before any stream starts. The engine is held after its first step (the running request's prefill), so
    the state is the same however slow the machine; released, both queued requests finish."""
    path, _ = checkpoint("llama")
    s = Server(path, max_waiting_requests=1, max_num_seqs=1, max_num_batched_tokens=128)
    first_step, release = threading.Event(), threading.Event()
    real_step = s.engine.engine.step

    def held_step():
        outputs = real_step()
        first_step.set()
        release.wait(timeout=60)  # the engine thread holds still until the test has seen its 429s
        return outputs

    s.engine.engine.step = held_step
    try:
        client = openai.AsyncOpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=60)

        async def until(condition, what):
            deadline = time.time() + 30
            while not condition():
                assert time.time() < deadline, what
                await asyncio.sleep(0.01)

        async def main():
            long = dict(model="tiny", prompt="the", max_tokens=16, extra_body={"ignore_eos": True})  # held: any length
            running = asyncio.ensure_future(client.completions.create(**long))
            await until(first_step.is_set, "the first request never ran")
            assert len(s.engine.engine.scheduler.running) == 1
            waiting = asyncio.ensure_future(client.completions.create(**long))
            await until(lambda: s.engine.num_waiting() == 1, "the second request never queued")
            try:
                with pytest.raises(openai.RateLimitError):
                    await client.completions.create(**{**long, "max_tokens": 2}, stream=True)
                with pytest.raises(openai.RateLimitError):
                    await client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
                    )
                assert s.engine.num_waiting() == 1 and not running.done() and not waiting.done()
            finally:
                release.set()
            return await running, await waiting

        first, second = asyncio.run(main())
        assert len(first.choices[0].text) > 0 and first.choices[0].finish_reason == "length"
        assert second.choices[0].finish_reason == "length"
        assert s.idle_and_free()
    finally:
        release.set()
        s.close()


def test_an_invalid_request_is_a_400_naming_the_value_even_when_the_queue_is_full(checkpoint):
    """Validation comes before capacity, as in vLLM's server (every check runs before ``engine_client.generate``):
    a request that could never succeed gets its 400 whatever the queue's state; a valid one then gets the 429."""
    path, _ = checkpoint("llama")
    s = Server(path, max_waiting_requests=1, max_num_seqs=8)
    release = threading.Event()
    real_step = s.engine.engine.step
    s.engine.engine.step = lambda: (release.wait(timeout=30), real_step())[1]  # the engine holds still
    try:
        results: list = []
        body = {"prompt": "the", "max_tokens": 2}
        post = lambda: results.append(httpx.post(f"{s.url}/v1/completions", json=body, timeout=30))  # noqa: E731
        first = threading.Thread(target=post)
        first.start()
        with httpx.Client(base_url=s.url, timeout=30) as client:
            deadline = time.time() + 10
            while s.engine.num_waiting() < 1:  # the first request fills the waiting queue
                assert time.time() < deadline, "the first request never queued"
                time.sleep(0.01)
            wide = client.post("/v1/completions", json={"prompt": "x", "n": 9, "temperature": 1.0})
            assert "max_num_seqs=8" in _error(wide, 400)["message"]
            full = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert _error(full, 429)["type"] == "rate_limit_exceeded"  # the queue really was full
        release.set()
        first.join(timeout=30)
        assert results and results[0].status_code == 200
        assert s.idle_and_free()
    finally:
        release.set()
        s.close()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_an_error_after_the_stream_started_is_an_error_event_then_done(checkpoint, route):
    path, _ = checkpoint("llama")
    s = Server(path)
    engine = s.engine.engine
    real_step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("simulated device failure")
        return real_step()

    engine.step = failing_step
    try:
        body = {"max_tokens": 50, "stream": True, "ignore_eos": True}
        body.update({"prompt": "the"} if "chat" not in route else {"messages": [{"role": "user", "content": "x"}]})
        with httpx.stream("POST", f"{s.url}{route}", json=body, timeout=30) as r:
            assert r.status_code == 200
            events = sse_events(r)
        assert events[-1] == "[DONE]" and "simulated device failure" in events[-2]["error"]["message"]
        assert events[-2]["error"]["code"] == 500
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=30)
        with pytest.raises(openai.APIStatusError):  # the engine is dead now: 503, never a silent empty answer
            client.completions.create(model="tiny", prompt="the", max_tokens=3, stream=True)
        assert httpx.get(f"{s.url}/health").status_code == 503
    finally:
        s.close()


@pytest.mark.parametrize("api_key", [None, "sesame"])
def test_non_streamed_clients_that_leave_are_aborted(checkpoint, api_key):
    path, _ = checkpoint("llama")
    s = Server(path, api_key=api_key, max_num_seqs=2, max_model_len=256, num_gpu_blocks=128)
    try:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        body = {"prompt": "the", "max_tokens": 250, "ignore_eos": True}
        before = s.engine.engine.get_stats().generation_tokens_total

        async def leave_early():
            async with httpx.AsyncClient(base_url=s.url, headers=headers, timeout=30) as client:
                tasks = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(6)]
                # two run, four wait: leave as soon as the pair is generating (a fixed wait let a loaded machine
                # finish both answers before the disconnects reached the server)
                for _ in range(200):
                    await asyncio.sleep(0.05)
                    if s.engine.engine.get_stats().generation_tokens_total - before >= 2:
                        break
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run(leave_early())
        assert s.idle_and_free(timeout=5)
        generated = s.engine.engine.get_stats().generation_tokens_total - before
        assert 2 <= generated < 2 * 250, generated  # the running pair did not run to its end; the waiting never ran
    finally:
        s.close()


def test_404_405_and_unparseable_bodies_answer_in_openai_shape(server):
    assert _error(httpx.get(f"{server.url}/nope"), 404)["type"] == "NotFoundError"
    assert _error(httpx.get(f"{server.url}/v1/completions"), 405)
    post = lambda content: httpx.post(  # noqa: E731
        f"{server.url}/v1/completions", content=content, headers={"content-type": "application/json"}, timeout=30
    )
    assert "UTF-8" in _error(post(b'{"prompt": "\xff\xfe"}'), 400)["message"]
    assert "nested" in _error(post(b"[" * 100_000 + b"]" * 100_000), 400)["message"]
    assert "JSON" in _error(post(b"{nope"), 400)["message"]
    assert _error(post(b'["a list"]'), 400)


def test_bodies_past_the_limit_get_413_and_long_prompts_do_not_stall_others(server):
    big = {"prompt": "the quick brown fox " * 20_000}  # 400 KB > the 256 KiB limit
    error = _error(httpx.post(f"{server.url}/v1/completions", json=big, timeout=30), 413)
    assert "limit" in error["message"]
    # tokenization runs off the event loop: /health answers while a (here slowed-down) encode is under way
    tokenizer = server.engine.engine.tokenizer
    real_encode = tokenizer.encode

    def slow_encode(text, *args, **kwargs):
        if len(text) > 100_000:
            time.sleep(1.5)  # as a multi-megabyte prompt takes; on the event loop it would stall every client
        return real_encode(text, *args, **kwargs)

    prompt = "the quick brown fox jumps over " * 8_000  # 240 KB
    done, latencies = {}, []
    tokenizer.encode = slow_encode

    def big_request():
        t0 = time.perf_counter()
        done["status"] = httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt}, timeout=60).status_code
        done["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=big_request)
    thread.start()
    while thread.is_alive():
        t0 = time.perf_counter()
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        latencies.append(time.perf_counter() - t0)
        time.sleep(0.02)
    thread.join()
    del tokenizer.encode
    assert done["status"] == 400  # longer than the context, found out after tokenizing
    assert len(latencies) >= 3 and max(latencies) < done["seconds"] / 2, (latencies, done)


def test_api_key_from_the_environment_any_scheme_case_and_digest_compare(checkpoint, monkeypatch):
    path, _ = checkpoint("llama")
    s = Server(path, api_key="sesame")
    try:
        body = {"prompt": "the", "max_tokens": 2}
        for value, status in (("bearer sesame", 200), ("BEARER sesame", 200), ("Basic sesame", 401),
                              ("Bearer sesam", 401), ("Bearer sesame2", 401), ("sesame", 401)):  # fmt: skip
            r = httpx.post(f"{s.url}/v1/completions", json=body, headers={"Authorization": value}, timeout=30)
            assert r.status_code == status, value
    finally:
        s.close()
    from paged_serve._infra import api_key

    source = open(api_key.__file__).read()
    assert "sha256" in source and "compare_digest" in source
    monkeypatch.setenv("PAGED_SERVE_API_KEY", "from-env")
    captured = {}
    monkeypatch.setattr(
        "paged_serve._compat.openai.api_server.run_server", lambda app, *a, **k: captured.update(app=app)
    )
    cli_main(["serve", path, "--port", "0", "--num-gpu-blocks", "32", "--max-model-len", "64"])
    from fastapi.testclient import TestClient

    client = TestClient(captured["app"])
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer from-env"}).status_code == 200


def test_compatibility_fields_of_openai_clients(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=30)
    (card,) = client.models.list().data
    assert card.id == "tiny" and card.created > 0 and card.owned_by
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": [{"type": "text", "text": "the lazy"}, {"type": "text", "text": "dog"}]}],
        max_tokens=3,
        temperature=0,
        response_format={"type": "text"},
        user="tester",
        store=False,
        parallel_tool_calls=False,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        logit_bias={"42": 100},
    )
    assert chat.choices[0].message.content == server.engine.engine.tokenizer.decode([42] * 3)
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(
            model="tiny", max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.completions.create(
            model="tiny", prompt="x", max_tokens=2, extra_body={"response_format": {"type": "json_object"}}
        )
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, n=2, temperature=0)
    assert "n must be 1" in str(info.value) and "best_of" not in str(info.value)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=2.5)


def test_too_many_prompts_for_the_waiting_queue_is_a_400_not_a_429(checkpoint):
    path, _ = checkpoint("llama")
    s = Server(path, max_waiting_requests=3)
    try:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": ["a", "b", "c", "d"], "max_tokens": 2}, timeout=30)
        assert "max_waiting_requests=3" in _error(r, 400)["message"]
        ok = httpx.post(f"{s.url}/v1/completions", json={"prompt": ["a", "b", "c"], "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 3
    finally:
        s.close()


def test_a_port_in_use_fails_at_once_in_one_line(checkpoint):
    path, _ = checkpoint("llama")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        t0 = time.perf_counter()
        with pytest.raises(SystemExit) as info:
            cli_main(["serve", path, "--port", str(port)])
        assert time.perf_counter() - t0 < 2  # before any weight is read
        message = str(info.value)
        assert f"127.0.0.1:{port}" in message and "\n" not in message
    finally:
        taken.close()


def test_sigterm_under_load_exits_cleanly_within_the_shutdown_timeout(checkpoint, tmp_path):
    path, _ = checkpoint("llama")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    cmd = [sys.executable, "-m", "paged_serve.entrypoints.cli", "serve", path, "--port", str(port),
           "--num-gpu-blocks", "64", "--max-model-len", "256", "--max-num-seqs", "2", "--shutdown-timeout", "1",
           "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else "no start"
            time.sleep(0.2)

        async def load():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                body = {"prompt": "the", "max_tokens": 250, "ignore_eos": True}
                tasks = [asyncio.ensure_future(client.post("/v1/completions", json={**body, "stream": i % 2 == 0}))
                         for i in range(6)]  # fmt: skip
                await asyncio.sleep(1.0)
                proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*tasks, return_exceptions=True)

        t0 = time.perf_counter()
        asyncio.run(load())
        rc = proc.wait(timeout=20)
        elapsed = time.perf_counter() - t0
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and "Traceback" not in stderr, stderr
    assert elapsed < 15, elapsed


def test_no_client_mix_can_wedge_the_server(checkpoint):
    """The issue's acceptance load: 200 concurrent streaming clients (100 leave mid-stream), 20 non-streamed
    clients that leave, a queue that overflows (429s) and an n=257 request (400), all at once; afterwards the
    server answers, nothing runs or waits, and every KV block is free."""
    path, _ = checkpoint("llama")
    s = Server(path, max_waiting_requests=64, num_gpu_blocks=512)  # max_num_seqs: vLLM's default 256
    try:

        async def streaming(client, i):
            body = {"prompt": [3 + i % 50, 7, 9], "max_tokens": 12, "ignore_eos": True, "stream": True,
                    "temperature": 0.8, "seed": i}  # fmt: skip
            async with client.stream("POST", "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return r.status_code, r.json()["error"]["type"]
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and i % 2 == 1:
                        return "left", None  # closes the connection mid-stream
                    if line == "data: [DONE]":
                        return 200, None
            return "cut", None

        async def leaves(client):
            try:
                await asyncio.wait_for(
                    client.post("/v1/completions", json={"prompt": "the", "max_tokens": 100, "ignore_eos": True}), 0.3
                )
                return "finished"
            except asyncio.TimeoutError:
                return "left"

        async def main():
            limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) as client:
                wide = client.post("/v1/completions", json={"prompt": "x", "n": 257, "temperature": 1.0})
                return await asyncio.gather(
                    wide, *(streaming(client, i) for i in range(200)), *(leaves(client) for _ in range(20))
                )

        results = asyncio.run(main())
        wide, streams, quitters = results[0], results[1:201], results[201:]
        assert wide.status_code == 400 and "max_num_seqs=256" in wide.json()["error"]["message"]
        kinds = {r for r, _ in streams}
        assert kinds <= {200, 429, "left"}, kinds  # never a stream cut without [DONE]
        assert sum(r == 200 for r, _ in streams) > 0 and sum(r == "left" for r, _ in streams) > 0
        assert all(t == "rate_limit_exceeded" for r, t in streams if r == 429)
        assert quitters.count("left") > 0
        assert s.idle_and_free(timeout=15), "requests or blocks left behind"
        stats = s.engine.engine.get_stats()
        assert stats.num_running == stats.num_waiting == stats.num_swapped == 0
        after = httpx.post(f"{s.url}/v1/completions", json={"prompt": "the", "max_tokens": 3}, timeout=30)
        assert after.status_code == 200 and httpx.get(f"{s.url}/health").status_code == 200
    finally:
        s.close()
