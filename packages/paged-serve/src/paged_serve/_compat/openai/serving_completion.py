"""``/v1/completions`` (vLLM ``serving_completion.py``): one engine request per prompt, merged into one response.

Non-streaming answers once every prompt is done; streaming sends each request's new text as a server-sent event
chunk, then ``data: [DONE]``. A prompt may be text, a list of texts, token ids or a list of token-id lists.
"""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from paged_serve._compat.openai.protocol import CompletionRequest
from paged_serve._compat.openai.serving_engine import OpenAIError, OpenAIServing, guard_stream, sse, token_texts
from paged_serve.outputs import CompletionOutput


def _logprobs(tokenizer, token_ids, logprobs, offset: int, context=(), skip: bool = True, final: bool = True,
              as_ids: bool = False):  # fmt: skip
    """OpenAI's completion logprobs; a ``None`` entry (a prompt's first token) has no logprob and no top list.

    Each token's text is its share of the decoded text (``token_texts``): the bytes of a character split across
    byte-level tokens come out whole with the token that completes it, the others as "", so the tokens concatenate
    to the text and ``text_offset`` indexes it. ``as_ids``: tokens (and top_logprobs keys) are "token_id:<id>"
    (vLLM's ``return_tokens_as_token_ids``), the offsets still index the text.
    """
    if logprobs is None:
        return None
    tokens, token_logprobs, top, offsets = [], [], [], []
    texts = token_texts(tokenizer, token_ids, logprobs, context, skip, final)
    for (text, alternatives), token_id, lps in zip(texts, token_ids, logprobs):
        tokens.append(f"token_id:{token_id}" if as_ids else text or "")
        offsets.append(offset)
        offset += len(text or "")
        if lps is None:
            token_logprobs.append(None)
            top.append(None)
        else:
            token_logprobs.append(lps[token_id].logprob)
            entry: dict[str, float] = {}
            for t, lp in sorted(lps.items(), key=lambda kv: kv[1].rank or 0):  # texts can collide: the best wins
                entry.setdefault(f"token_id:{t}" if as_ids else alternatives[t], lp.logprob)
            top.append(entry)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _is_token_ids(prompt) -> bool:
    return isinstance(prompt, list) and bool(prompt) and not any(isinstance(x, str) for x in prompt)


class OpenAIServingCompletion(OpenAIServing):
    async def _prompts(self, request: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        p = request.prompt
        if isinstance(p, str):
            return [(p, await self.encode(p))]
        if not p:
            raise OpenAIError("the prompt is empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [(None, self.check_ids(list(p)))]
        if all(isinstance(x, str) for x in p):
            return [(x, await self.encode(x)) for x in p]
        return [(None, self.check_ids(list(x))) for x in p]

    async def create_completion(self, request: CompletionRequest, raw: Request):
        self.check_model(request.model)
        if self.engine.engine.tokenizer is None and not _is_token_ids(request.prompt):
            raise OpenAIError("the server runs with skip_tokenizer_init: prompts must be token ids", param="prompt")
        prompts = await self._prompts(request)
        params = [
            self.make_params(request, self.check_length(ids, request.max_tokens), request.logprobs)
            for _, ids in prompts
        ]
        if request.echo and request.logprobs is not None:  # echo scores the prompt tokens too
            for p in params:
                p.prompt_logprobs = request.logprobs
        base = self.new_id("cmpl")
        self.log_request(request, base)
        streams = await self.admit([(f"{base}-{i}", None, params[i], ids) for i, (_, ids) in enumerate(prompts)])
        n = request.n
        if request.stream:
            events = self._stream(request, base, prompts, [self.outputs(raw, s) for s in streams], n)
            return StreamingResponse(guard_stream(events, streams), media_type="text/event-stream")
        finals = await self.final_outputs(raw, streams)
        choices, completion_tokens = [], 0
        for i, ((text, ids), final) in enumerate(zip(prompts, finals)):
            prefix = self._echo_text((text, ids)) if request.echo else ""
            for out in final.outputs:
                completion_tokens += len(out.token_ids)
                choices.append(
                    {
                        "index": i * n + out.index,
                        "text": prefix + out.text,
                        "logprobs": self._choice_logprobs(request, ids, final, out, len(prefix)),
                        "finish_reason": out.finish_reason,
                        "stop_reason": out.stop_reason,
                    }
                )
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        body = {
            "id": base,
            "object": "text_completion",
            "created": self.created(),
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }
        return JSONResponse(body)

    async def _stream(self, request: CompletionRequest, base: str, prompts, streams, n: int):
        created, queue = self.created(), asyncio.Queue()
        usage = {"prompt_tokens": sum(len(ids) for _, ids in prompts), "completion_tokens": 0}

        async def pump(i, stream):
            try:
                async for output in stream:
                    await queue.put((i, output))
                await queue.put((i, None))
            except Exception as exc:  # noqa: BLE001 - handed to the response, which ends the stream with it
                await queue.put((i, exc))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        try:
            # echo: the prompt first; with logprobs it waits for the prefill that scores the prompt tokens
            pending_echo = set(range(len(prompts))) if request.echo else set()
            as_ids = self.token_id_names(request)
            if request.logprobs is None:
                for i in sorted(pending_echo):
                    for event in self._echo(base, created, prompts[i], i, n, None):
                        yield event
                pending_echo.clear()
            # per choice: the ids before the tokens not yet sent, the text sent so far, the tokens not yet sent
            sent: dict[int, tuple[list, int, list, list]] = {}
            remaining = len(streams)
            while remaining:
                i, output = await queue.get()
                if isinstance(output, Exception):
                    raise output
                if output is None:
                    remaining -= 1
                    continue
                if i in pending_echo and (output.prompt_logprobs is not None or output.finished):
                    pending_echo.discard(i)
                    lps = output.prompt_logprobs
                    skip = request.skip_special_tokens
                    for event in self._echo(base, created, prompts[i], i, n, lps, skip, as_ids):
                        yield event
                for out in output.outputs:
                    usage["completion_tokens"] += len(out.token_ids)
                    index = i * n + out.index
                    echo_len = len(self._echo_text(prompts[i])) if request.echo else 0
                    context, offset, ids, lps = sent.get(index, (prompts[i][1], echo_len, [], []))
                    ids, lps = ids + list(out.token_ids), lps + list(out.logprobs or [])
                    if not (out.text or out.finish_reason is not None):  # inside a character: sent with its end
                        sent[index] = (context, offset, ids, lps)
                        continue
                    final = out.finish_reason is not None
                    logprobs = _logprobs(self.tokenizer, ids, lps if out.logprobs is not None else None, offset,
                                         context, request.skip_special_tokens, final, as_ids)  # fmt: skip
                    sent[index] = (context + ids, offset + len(out.text), [], [])
                    yield sse(self._chunk(base, created, index, out.text, out, out.finish_reason, logprobs))
            if request.stream_options and request.stream_options.include_usage:
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                yield sse(
                    {
                        "id": base,
                        "object": "text_completion",
                        "created": created,
                        "model": self.model_name,
                        "choices": [],
                        "usage": usage,
                    }
                )
            yield sse("[DONE]")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _choice_logprobs(self, request, prompt_ids, final, out: CompletionOutput, offset: int) -> dict | None:
        """With ``echo``, the prompt tokens' logprobs come first (vLLM's prompt_logprobs), from offset 0."""
        if out.logprobs is None:
            return None
        skip, as_ids = request.skip_special_tokens, self.token_id_names(request)
        if request.echo and final.prompt_logprobs is not None:
            lps = final.prompt_logprobs + out.logprobs
            return _logprobs(self.tokenizer, prompt_ids + out.token_ids, lps, 0, skip=skip, as_ids=as_ids)
        return _logprobs(self.tokenizer, out.token_ids, out.logprobs, offset, prompt_ids, skip, as_ids=as_ids)

    def _echo_text(self, prompt) -> str:
        text, ids = prompt
        return text if text is not None else self.tokenizer.decode(ids)

    def _echo(self, base, created, prompt, i: int, n: int, prompt_logprobs, skip: bool = True, as_ids: bool = False):
        echo = self._echo_text(prompt)
        lp = None
        if prompt_logprobs:
            lp = _logprobs(self.tokenizer, prompt[1], prompt_logprobs, 0, skip=skip, as_ids=as_ids)
        for k in range(n):
            yield sse(self._chunk(base, created, i * n + k, echo, None, None, lp))

    def _chunk(self, base, created, index, text, out, finish_reason, logprobs=None) -> dict:
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
            "stop_reason": out.stop_reason if out else None,
        }
        return {
            "id": base,
            "object": "text_completion",
            "created": created,
            "model": self.model_name,
            "choices": [choice],
        }
