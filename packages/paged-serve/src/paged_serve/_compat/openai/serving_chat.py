"""``/v1/chat/completions`` (vLLM ``serving_chat.py``): messages through the model's chat template, one request.

The prompt is rendered from tokenizer_config.json's chat template; streaming sends the assistant role first, then
content deltas, then the finish reason, then ``data: [DONE]``.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2.exceptions import TemplateError

from paged_serve._compat.async_llm_engine import AsyncLLMEngine
from paged_serve._compat.chat_utils import (
    apply_hf_chat_template,
    parse_chat_messages,
    resolve_chat_template_content_format,
)
from paged_serve._compat.openai.protocol import ChatCompletionRequest
from paged_serve._compat.openai.serving_engine import OpenAIError, OpenAIServing, guard_stream, sse, token_texts


class OpenAIServingChat(OpenAIServing):
    def __init__(self, engine: AsyncLLMEngine, served_model_name: str | list[str], log_requests: bool = True,
                 chat_template: str | None = None, chat_template_content_format: str = "auto",
                 return_tokens_as_token_ids: bool = False):  # fmt: skip
        """``chat_template``: the server's template (``--chat-template``) instead of the tokenizer's."""
        super().__init__(engine, served_model_name, log_requests, return_tokens_as_token_ids)
        self.chat_template = chat_template
        self.content_format = "string"
        if self.tokenizer is not None:
            self.content_format = resolve_chat_template_content_format(
                chat_template, None, chat_template_content_format, self.tokenizer
            )

    @staticmethod
    def _logprobs(texts: list[tuple], token_ids, logprobs, top: int, as_ids: bool = False) -> dict:
        """OpenAI's chat logprobs, as vLLM's ``_create_chat_logprobs``: each token (and each of its ``top``
        alternatives, by rank) with its text and that text's UTF-8 ``bytes``. ``texts`` are ``token_texts``': a
        character split over byte-level tokens comes whole with the token completing it and "" (no bytes) before,
        so the tokens join to the message; special tokens show as text (vLLM's decode keeps them). ``as_ids``:
        every token is "token_id:<id>" instead (vLLM's ``return_tokens_as_token_ids``)."""
        content = []
        for (text, alternatives), token_id, lps in zip(texts, token_ids, logprobs):
            text = text or ""
            if as_ids:
                text, alternatives = f"token_id:{token_id}", {t: f"token_id:{t}" for t in alternatives}
            ranked = sorted(lps.items(), key=lambda kv: kv[1].rank or 0)[:top]
            content.append(
                {
                    "token": text,
                    "logprob": max(lps[token_id].logprob, -9999.0),
                    "bytes": list(text.encode()),
                    "top_logprobs": [
                        {
                            "token": alternatives[t],
                            "logprob": max(lp.logprob, -9999.0),
                            "bytes": list(alternatives[t].encode()),
                        }
                        for t, lp in ranked
                    ],
                }
            )
        return {"content": content}

    def _final_logprobs(self, out, prompt_ids: list[int], top: int, as_ids: bool) -> dict:
        texts = token_texts(self.tokenizer, out.token_ids, out.logprobs, prompt_ids, skip=False, final=True)
        return self._logprobs(texts, out.token_ids, out.logprobs, top, as_ids)

    async def create_chat_completion(self, request: ChatCompletionRequest, raw: Request):
        self.check_model(request.model)
        if self.tokenizer is None:
            raise OpenAIError("the server runs with skip_tokenizer_init: no chat template to render", 400)
        try:
            messages = [{**m.model_dump(exclude_none=True), "content": m.text()} for m in request.messages]
            if self.content_format == "openai":  # the template reads the parts themselves
                messages = [m.model_dump(exclude_none=True) for m in request.messages]
        except ValueError as exc:
            raise OpenAIError(str(exc), param="messages") from None
        try:
            prompt = apply_hf_chat_template(
                self.tokenizer,
                parse_chat_messages(messages, self.content_format),
                chat_template=self.chat_template,
                add_generation_prompt=request.add_generation_prompt,
            )
        except (TemplateError, ValueError) as exc:
            raise OpenAIError(f"chat template failed: {exc}", param="messages") from None
        ids = await self.encode(prompt, add_special_tokens=False)
        if request.max_tokens is not None and request.max_completion_tokens is not None:
            raise OpenAIError("give max_tokens or max_completion_tokens, not both", param="max_tokens")
        max_tokens = self.check_length(ids, request.max_completion_tokens or request.max_tokens)
        top = request.top_logprobs or 0  # in range and with logprobs=true: checked by the request model
        params = self.make_params(request, max_tokens, top if request.logprobs else None)
        request_id = self.new_id("chatcmpl")
        self.log_request(request, request_id)
        streams = await self.admit([(request_id, None, params, ids)])
        if request.stream:
            events = self._stream(request, request_id, self.outputs(raw, streams[0]), ids, top)
            return StreamingResponse(guard_stream(events, streams), media_type="text/event-stream")
        (final,) = await self.final_outputs(raw, streams)
        as_ids = self.token_id_names(request)
        choices = [
            {
                "index": out.index,
                "message": {"role": "assistant", "content": out.text},
                "logprobs": self._final_logprobs(out, ids, top, as_ids) if request.logprobs else None,
                "finish_reason": out.finish_reason,
                "stop_reason": out.stop_reason,
            }
            for out in final.outputs
        ]
        completion_tokens = sum(len(o.token_ids) for o in final.outputs)
        usage = {
            "prompt_tokens": len(ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(ids) + completion_tokens,
        }
        return JSONResponse(
            {
                "id": request_id,
                "object": "chat.completion",
                "created": self.created(),
                "model": self.model_name,
                "choices": choices,
                "usage": usage,
            }
        )

    async def _stream(self, request: ChatCompletionRequest, request_id: str, stream, prompt_ids: list[int], top: int):
        created = self.created()
        head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": self.model_name}
        for i in range(request.n):
            yield sse(
                {
                    **head,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
        completion_tokens, num_prompt = 0, len(prompt_ids)
        # per choice: the ids up to the last whole character, and the ids after it (already sent as "")
        decoded: dict[int, tuple[list[int], list[int]]] = {}
        async for output in stream:
            for out in output.outputs:
                completion_tokens += len(out.token_ids)
                if not out.text and not out.token_ids and out.finish_reason is None:
                    continue
                logprobs = None
                if request.logprobs:  # every step's tokens, as vLLM sends them; "" inside a character
                    context, pending = decoded.get(out.index, (prompt_ids, []))
                    ids, final = pending + list(out.token_ids), out.finish_reason is not None
                    texts = token_texts(self.tokenizer, ids, [None] * len(pending) + list(out.logprobs), context,
                                        False, final)  # fmt: skip
                    as_ids = self.token_id_names(request)
                    logprobs = self._logprobs(texts[len(pending) :], out.token_ids, out.logprobs, top, as_ids)
                    whole = max((k + 1 for k, (text, _) in enumerate(texts) if text is not None), default=0)
                    decoded[out.index] = (context + ids[:whole], ids[whole:])
                choice = {
                    "index": out.index,
                    "delta": {"content": out.text} if out.text or out.token_ids else {},
                    "logprobs": logprobs,
                    "finish_reason": out.finish_reason,
                }
                yield sse({**head, "choices": [choice]})
        if request.stream_options and request.stream_options.include_usage:
            usage = {
                "prompt_tokens": num_prompt,
                "completion_tokens": completion_tokens,
                "total_tokens": num_prompt + completion_tokens,
            }
            yield sse({**head, "choices": [], "usage": usage})
        yield sse("[DONE]")
