"""The server's wire contract: JSON bodies only (415 otherwise), the published OpenAPI schema as strict as the
server, and completion logprobs whose tokens and offsets agree with the text on multi-byte characters.

vLLM's counterparts: ``api_server.validate_json_request``, FastAPI's ``/openapi.json`` and ``/docs``,
``detokenizer_utils.detokenize_incrementally`` behind ``serving_completion._create_completion_logprobs``.
"""

from __future__ import annotations

import httpx
import pytest

from .server_util import Server, sse_events

TEXT = "héllo — 世界 ok"  # 2-, 3- and 3-byte characters: byte-level BPE splits each into byte tokens


@pytest.fixture(scope="module")
def server(checkpoint):
    path, _ = checkpoint("llama")
    s = Server(path)
    yield s
    s.close()


def _error(r, status):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "text/plain;charset=UTF-8", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded",
     None],
)  # fmt: skip
def test_a_json_body_not_declared_json_is_a_415_and_runs_nothing(server, route, content_type):
    body = (
        b'{"prompt": "the", "max_tokens": 2}'
        if route == "/v1/completions"
        else b'{"messages": [{"role": "user", "content": "the"}], "max_tokens": 2}'
    )
    headers = {} if content_type is None else {"content-type": content_type}
    before = server.engine.engine.get_stats().prompt_tokens_total
    error = _error(httpx.post(f"{server.url}{route}", content=body, headers=headers, timeout=30), 415)
    assert "application/json" in error["message"]
    assert server.engine.engine.get_stats().prompt_tokens_total == before
    declared = {"content-type": "application/json; charset=utf-8"}  # the same body declared JSON runs
    assert httpx.post(f"{server.url}{route}", content=body, headers=declared, timeout=30).status_code == 200


def _check_logprobs(lp, text):
    tokens, offsets = lp["tokens"], lp["text_offset"]
    assert "".join(tokens) == text
    for token, offset in zip(tokens, offsets):
        assert text[offset : offset + len(token)] == token
    assert offsets == sorted(offsets)


def test_echo_logprobs_on_multibyte_text_agree_with_the_text(server):
    tok = server.engine.engine.tokenizer
    ids = tok.encode(TEXT)
    assert len(ids) > len(TEXT) and "\ufffd" in tok.decode([ids[1]])  # the byte-level split the test is about
    body = {"prompt": TEXT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 3, "echo": True}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(TEXT) and len(lp["tokens"]) == len(ids) + 6
    _check_logprobs(lp, choice["text"])
    assert "\ufffd" not in "".join(lp["tokens"][: len(ids)])
    # a split character comes whole with its last byte, the bytes before it as ""
    assert "世" in lp["tokens"][: len(ids)] or any("世" in t for t in lp["tokens"])
    assert "" in lp["tokens"][: len(ids)]
    # without echo the output's offsets start at 0 and its tokens make its text
    r = httpx.post(f"{server.url}/v1/completions", json={**body, "echo": False}, timeout=30)
    choice = r.json()["choices"][0]
    _check_logprobs(choice["logprobs"], choice["text"])
    # streamed: each chunk's tokens make the chunk's text, the offsets continue across chunks from the echo
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=30) as r:
        chunks = [e["choices"][0] for e in sse_events(r)[:-1] if e["choices"]]
    streamed = "".join(c["text"] for c in chunks)
    assert streamed == TEXT + choice["text"]  # greedy: the echo, then the same completion
    for c in chunks:
        assert "".join(c["logprobs"]["tokens"]) == c["text"]
        for token, offset in zip(c["logprobs"]["tokens"], c["logprobs"]["text_offset"]):
            assert streamed[offset : offset + len(token)] == token
    assert sum(len(c["logprobs"]["tokens"]) for c in chunks) == len(ids) + 6


def test_generated_multibyte_output_keeps_tokens_and_offsets_on_the_text(server):
    """Output tokens that are single bytes of a character (forced by logit_bias) come back as "" until the
    character completes; the last token of a finished sequence takes an unfinished character's bytes."""
    tok = server.engine.engine.tokenizer
    byte_ids = tok.encode("界")  # three byte tokens
    assert len(byte_ids) == 3
    for bias_ids, max_tokens in ((byte_ids, 6), (byte_ids[:1], 2)):
        body = {
            "prompt": "the",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 2,
            "logit_bias": {str(t): 100 for t in bias_ids},
        }
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        _check_logprobs(choice["logprobs"], choice["text"])
        assert "" in choice["logprobs"]["tokens"]
