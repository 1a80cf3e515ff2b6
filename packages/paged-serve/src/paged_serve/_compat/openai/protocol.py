"""OpenAI API request bodies (vLLM ``entrypoints/openai/protocol.py``), validated by pydantic.

OpenAI's fields plus vLLM's sampling extras (top_k, min_p, repetition_penalty, ...). Fields OpenAI clients send
that have no effect here (``tools``, ``parallel_tool_calls``, ``store``, ...) are accepted and logged as ignored,
as vLLM does; fields nobody defines are refused (400), and every sampling value goes through ``SamplingParams``
so the error names it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from paged_serve.sampling_params import RequestOutputKind, SamplingParams

_INT64 = 2**63


_IGNORED = ("tools", "tool_choice", "parallel_tool_calls", "store", "metadata", "service_tier")
_MODEL_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # generation config may set


class ResponseFormat(BaseModel):
    """Only plain text is produced (no guided decoding): ``{"type": "text"}``; the JSON modes are refused."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    n: int = 1
    best_of: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = Field(default=None, ge=-_INT64, le=_INT64 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # OpenAI's end-user id: logged with the request
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias):
        if bias is None:
            return None
        try:  # OpenAI sends token ids as JSON object keys (strings); vLLM clamps the bias to [-100, 100]
            return {str(int(k)): min(100.0, max(-100.0, float(v))) for k, v in bias.items()}
        except ValueError:
            raise ValueError(f"keys must be token ids, got {sorted(bias)[:5]}") from None

    def ignored_fields(self) -> list[str]:
        """Fields accepted for compatibility that change nothing here (logged once per request)."""
        return sorted(n for n in _IGNORED if getattr(self, n, None) is not None)

    def sampling_params(self, max_tokens: int, logprobs: int | None, defaults: dict | None = None) -> SamplingParams:
        """The request's ``SamplingParams``; a field it leaves out takes ``defaults`` (the model's generation
        config, vLLM's ``default_sampling_params``) where that has it."""
        unset = {k: v for k, v in (defaults or {}).items() if k in _MODEL_DEFAULTS and k not in self.model_fields_set}
        sampling = {k: getattr(self, k) for k in _MODEL_DEFAULTS} | unset
        return SamplingParams(
            n=self.n,
            best_of=self.best_of,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            **sampling,
            seed=self.seed,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            max_tokens=max_tokens,
            logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens,
            use_beam_search=self.use_beam_search,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
        )


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16)
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


class ContentPart(BaseModel):
    """One part of a message's content list; only text parts can reach a text-only model."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = ""
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str | None:
        """The content as one string, text parts joined (vLLM's "string" content format)."""
        if not isinstance(self.content, list):
            return self.content
        kinds = sorted({p.type for p in self.content if p.type != "text"})
        if kinds:
            raise ValueError(f"content parts of type {kinds} are not supported: this server runs text-only models")
        return "\n".join(p.text or "" for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo
