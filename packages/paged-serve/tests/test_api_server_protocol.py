"""The server's wire contract: JSON bodies only (415 otherwise), the published OpenAPI schema as strict as the
server, and completion logprobs whose tokens and offsets agree with the text on multi-byte characters.

vLLM's counterparts: ``api_server.validate_json_request``, FastAPI's ``/openapi.json`` and ``/docs``,
``detokenizer_utils.detokenize_incrementally`` behind ``serving_completion._create_completion_logprobs``.
"""

from __future__ import annotations

import httpx
import pytest
import torch

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
    prompt_tokens = lp["tokens"][: len(ids)]
    assert {"é", "—", "世", "界"} <= set(prompt_tokens)
    assert prompt_tokens.count("") == sum(len(c.encode()) - 1 for c in TEXT)
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


# ---------------------------------------------------------------- the published schema
def _request_validator(document, name):
    """A JSON Schema 2020-12 validator of one request body, its ``$ref``s resolved inside the OpenAPI document."""
    from jsonschema import Draft202012Validator

    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return Draft202012Validator(schema)


def test_openapi_and_docs_are_published_and_valid(server):
    from jsonschema import Draft202012Validator

    r = httpx.get(f"{server.url}/openapi.json")
    assert r.status_code == 200, r.text
    document = r.json()
    assert document["openapi"].startswith("3.1")  # OpenAPI 3.1: its schemas are JSON Schema 2020-12
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)  # every schema valid under the metaschema, or SchemaError
    for route, request, response in (
        ("/v1/completions", "CompletionRequest", "CompletionResponse"),
        ("/v1/chat/completions", "ChatCompletionRequest", "ChatCompletionResponse"),
    ):
        post = document["paths"][route]["post"]
        assert list(post["requestBody"]["content"]) == ["application/json"]
        assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{request}")
        assert post["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(f"/{response}")
        assert post["responses"]["415"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert (
        "ModelList"
        in document["paths"]["/v1/models"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    )
    docs = httpx.get(f"{server.url}/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text and "swagger" in docs.text.lower()
    # the constraints the server checks are stated
    schemas = document["components"]["schemas"]
    completion, chat = schemas["CompletionRequest"]["properties"], schemas["ChatCompletionRequest"]
    assert completion["suffix"]["type"] == "null"
    engine = server.engine.engine
    limits = {"minimum": 0, "maximum": engine.vocab_size - 1}
    ids = [o for o in completion["prompt"]["anyOf"] if o.get("type") == "array" and o["items"].get("type") == "integer"]
    assert ids and all(o["items"].items() >= limits.items() for o in ids), completion["prompt"]
    int_logprobs = next(o for o in completion["logprobs"]["anyOf"] if o.get("type") == "integer")
    assert int_logprobs["maximum"] == engine.model_config.max_logprobs and int_logprobs["minimum"] == 0
    assert chat["if"]["required"] == ["top_logprobs"] and chat["then"]["properties"]["logprobs"] == {"const": True}
    assert completion["top_p"]["exclusiveMinimum"] == 0 and completion["n"]["minimum"] == 1


def _cases(rng, chat: bool, vocab: int, max_logprobs: int, count: int):
    """Request bodies, each with one or two fields drawn from either side of a stated constraint."""
    fields = {
        "n": [1, 0, -1],
        "top_p": [1.0, 0.5, 0.0, 1.5],
        "top_k": [-1, 5, 0, -2],
        "min_p": [0.0, 0.2, 1.5],
        "presence_penalty": [0.0, 1.0, 2.5],
        "repetition_penalty": [1.0, 1.2, 0.0],
        "max_tokens": [2, 0],
        "min_tokens": [0, 1, -1],
        "stop_token_ids": [[3], [-1]],
        "stop": ["x", "", ["x", "y"], [""]],
        "logit_bias": [{"5": 1.0}, {"-1": 100}, {"x": 1}],
        "best_of": [1, 0],
        "response_format": [{"type": "text"}, {"type": "json_object"}],
    }
    if chat:
        fields |= {"logprobs": [True, False], "top_logprobs": [None, 0, 2, max_logprobs, max_logprobs + 1, -1]}
    else:
        fields |= {
            "suffix": [None, "", "x"],
            "logprobs": [None, 0, 2, max_logprobs, max_logprobs + 1, -1],
            "prompt": ["the", [5, 6], [0, vocab - 1], [5, vocab], [-1], [], [[5], [6, 7]], [[5], [vocab]]],
        }
    names = sorted(fields)
    for _ in range(count):
        body = {"messages": [{"role": "user", "content": "the"}]} if chat else {"prompt": "the"}
        body |= {"max_tokens": 2, "temperature": 0}
        for name in rng.sample(names, 2):
            body[name] = rng.choice(fields[name])
        if body.get("max_tokens") == 2 and body.get("min_tokens") == 1:
            body["min_tokens"] = 0  # a cross-field rule (min_tokens <= max_tokens) the schema does not state
        yield body


@pytest.mark.parametrize("route,name", [("/v1/completions", "CompletionRequest"),
                                        ("/v1/chat/completions", "ChatCompletionRequest")])  # fmt: skip
def test_the_schema_rejects_exactly_what_the_server_rejects(server, route, name):
    import random

    document = httpx.get(f"{server.url}/openapi.json").json()
    validator = _request_validator(document, name)
    engine = server.engine.engine
    rng = random.Random(0)
    sides = {True: 0, False: 0}
    for body in _cases(rng, route.endswith("chat/completions"), engine.vocab_size, engine.model_config.max_logprobs,
                       40):  # fmt: skip
        valid = validator.is_valid(body)
        r = httpx.post(f"{server.url}{route}", json=body, timeout=30)
        why = [e.message for e in validator.iter_errors(body)]
        assert r.status_code == (200 if valid else 400), (body, r.text, why)
        sides[valid] += 1
    assert sides[True] >= 5 and sides[False] >= 5, sides  # both sides were exercised


# ---------------------------------------------------------------- chat logprobs on split characters
CYCLE_TEXT = "界é"  # 3 + 2 byte tokens under the test tokenizer's byte-level BPE


def _cycling_checkpoint(path, checkpoint_builder, messages):
    """The test Llama rewired so that greedy decoding after the chat prompt walks the bytes of ``CYCLE_TEXT`` over
    and over: attention and MLP outputs are zeroed (each position's final hidden state is its token's normalised
    embedding) and each cycle token's lm_head row is its predecessor's normalised embedding."""
    from transformers import AutoTokenizer

    model = checkpoint_builder(path)
    hf_tok = AutoTokenizer.from_pretrained(path)
    prompt = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = hf_tok.encode(prompt, add_special_tokens=False)
    cycle = hf_tok.encode(CYCLE_TEXT, add_special_tokens=False)
    assert len(cycle) == 5 and all("\ufffd" in hf_tok.decode([t]) for t in cycle)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        normed = model.model.norm(model.model.embed_tokens.weight)
        head = torch.zeros_like(model.lm_head.weight)
        for a, b in zip([prompt_ids[-1], *cycle], [*cycle, cycle[0]]):
            head[b] += 4 * normed[a]
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path)
    return prompt_ids, cycle


def _expected_texts(tok, prompt_ids, ids):
    """Each token's text from full-prefix decodes: the text it adds, "" while the text ends inside a character
    (the last token takes what is left)."""
    done, texts = tok.decode(prompt_ids, skip_special_tokens=False), []
    for k in range(len(ids)):
        text = tok.decode(prompt_ids + ids[: k + 1], skip_special_tokens=False)
        if text.endswith("\ufffd") and k < len(ids) - 1:
            texts.append("")
            continue
        texts.append(text[len(done) :])
        done = text
    return texts


def test_chat_logprobs_on_split_characters_agree_with_the_message(tmp_path, checkpoint_builder):
    """A reply made of byte tokens (界 = 3 bytes, é = 2, then a character cut off by max_tokens): each logprobs
    token is its share of the message, as vLLM's logprobs processor corrects lone byte decodes: "" (no bytes) for
    the bytes before a character's last, the whole character with its last byte, UTF-8 ``bytes`` of that text;
    the tokens join to the message, non-streamed and streamed (each chunk's tokens join to its delta)."""
    messages = [{"role": "user", "content": "the fox"}]
    prompt_ids, cycle = _cycling_checkpoint(tmp_path, checkpoint_builder, messages)
    s = Server(str(tmp_path), app_kw={"return_tokens_as_token_ids": True})  # the request below says False
    try:
        tok = s.engine.engine.tokenizer
        ids = (cycle * 2)[:7]  # 界 é, then 2 of 界's 3 bytes
        body = {"messages": messages, "max_tokens": 7, "temperature": 0, "ignore_eos": True, "logprobs": True,
                "top_logprobs": 2, "return_tokens_as_token_ids": False}  # fmt: skip
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        content, entries = choice["message"]["content"], choice["logprobs"]["content"]
        assert content == tok.decode(ids) and content.startswith(CYCLE_TEXT)  # the rewired model really cycles
        assert len(entries) == 7
        texts = _expected_texts(tok, prompt_ids, ids)
        assert [e["token"] for e in entries] == texts == ["", "", "界", "", "é", "", content[2:]]
        assert "".join(e["token"] for e in entries) == content
        for entry in entries:  # greedy: the best alternative is the token itself, with the same text and bytes
            assert entry["bytes"] == list(entry["token"].encode()) and len(entry["top_logprobs"]) == 2
            assert entry["top_logprobs"][0] == {k: entry[k] for k in ("token", "logprob", "bytes")}
            assert all(alt["bytes"] == list(alt["token"].encode()) for alt in entry["top_logprobs"])
        assert entries[2]["bytes"] == list("界".encode()) and entries[0]["bytes"] == []
        # streamed: one chunk per step, each chunk's tokens join to its delta, all of them to the message
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            chunks = [e["choices"][0] for e in sse_events(r)[:-1] if e["choices"]][1:]  # after the role chunk
        streamed = [e for c in chunks for e in (c["logprobs"] or {"content": []})["content"]]
        assert [e["token"] for e in streamed] == texts
        for c in chunks:
            if c["logprobs"]:
                assert "".join(e["token"] for e in c["logprobs"]["content"]) == c["delta"].get("content", "")
        assert "".join(c["delta"].get("content", "") for c in chunks) == content
        # vLLM's return_tokens_as_token_ids (the server's flag, here on; a request's field overrides it)
        del body["return_tokens_as_token_ids"]
        entries = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
        assert [e["token"] for e in entries["content"]] == [f"token_id:{t}" for t in ids]
        for entry in entries["content"]:
            assert entry["bytes"] == list(entry["token"].encode())
            assert entry["top_logprobs"][0]["token"] == entry["token"]
            assert all(alt["token"].startswith("token_id:") for alt in entry["top_logprobs"])
        body = {"prompt": prompt_ids, "max_tokens": 7, "temperature": 0, "ignore_eos": True, "logprobs": 1}
        choice = httpx.post(f"{s.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids] and choice["text"] == content
        assert choice["logprobs"]["text_offset"] == [0, 0, 0, 1, 1, 2, 2]  # still offsets into the text
        plain = httpx.post(f"{s.url}/v1/completions", json={**body, "return_tokens_as_token_ids": False}, timeout=60)
        assert plain.json()["choices"][0]["logprobs"]["tokens"] == texts
    finally:
        s.close()
