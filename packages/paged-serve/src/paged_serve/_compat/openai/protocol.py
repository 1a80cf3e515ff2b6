"""OpenAI API request bodies (vLLM ``entrypoints/openai/protocol.py``), validated by pydantic.

OpenAI's fields plus vLLM's sampling extras (top_k, min_p, repetition_penalty, ...). Fields OpenAI clients send
that have no effect here (``tools``, ``parallel_tool_calls``, ``store``, ...) are accepted and logged as ignored,
as vLLM does; fields nobody defines are refused (400), and every sampling value goes through ``SamplingParams``
so the error names it. The fields carry the server's own ranges, so the published schema (``/openapi.json``)
refuses what the server refuses; the server's limits (vocabulary, ``max_logprobs``) come as validation context
(``SERVER_LIMITS``) and are written into the schema by ``server_schema``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from paged_serve.sampling_params import RequestOutputKind, SamplingParams

_INT64 = 2**63
TokenId = Annotated[int, Field(ge=0)]
Count = Annotated[int, Field(ge=1)]
_IdKey = Annotated[str, Field(pattern=r"^[0-9]+$")]


_IGNORED = ("tools", "tool_choice", "parallel_tool_calls", "store", "metadata", "service_tier")
_MODEL_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # generation config may set


class ResponseFormat(BaseModel):
    """Only plain text is produced (no guided decoding): ``{"type": "text"}``; the JSON modes are refused."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"] = Field(description="json_object / json_schema need guided decoding, which is not here")
    json_schema: dict[str, Any] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    n: Count = 1
    best_of: Count | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)  # -1 and 0 are off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    seed: int | None = Field(default=None, ge=-_INT64, le=_INT64 - 1)
    stop: Annotated[str, Field(min_length=1)] | list[Annotated[str, Field(min_length=1)]] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # OpenAI's end-user id: logged with the request
    # OpenAI sends token ids as JSON object keys (strings): digits only, so the schema can say so
    logit_bias: Annotated[dict[_IdKey, float], Field(json_schema_extra={"additionalProperties": False})] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's: logprobs tokens as "token_id:<id>" (None: the server's --return-tokens-as-token-ids)
    return_tokens_as_token_ids: bool | None = None

    @field_validator("logit_bias")
    @classmethod
    def _clamp(cls, bias):  # vLLM clamps the bias to [-100, 100]
        return None if bias is None else {str(int(k)): min(100.0, max(-100.0, v)) for k, v in bias.items()}

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

    @field_validator("logprobs", "top_logprobs", check_fields=False)
    @classmethod
    def _max_logprobs(cls, value, info: ValidationInfo):
        limit = (info.context or {}).get("max_logprobs")
        if isinstance(value, int) and not isinstance(value, bool) and limit is not None and value > limit:
            raise ValueError(f"{info.field_name}={value} exceeds the server's max_logprobs ({limit})")
        return value


def _check_ids(ids: list[int], info: ValidationInfo) -> list[int]:
    vocab = (info.context or {}).get("vocab_size")
    bad = [t for t in ids if vocab is not None and t >= vocab]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    return ids


class CompletionRequest(_SamplingFields):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: Count | None = Field(default=16)
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    suffix: None = Field(default=None, description="not supported: only null")

    @field_validator("prompt")
    @classmethod
    def _prompt_ids(cls, prompt, info: ValidationInfo):
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            _check_ids(prompt, info)
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            for ids in prompt:
                _check_ids(ids, info)
        return prompt


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


_TOP_NEEDS_LOGPROBS = {  # JSON Schema's form of the validator below
    "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
}


class ChatCompletionRequest(_SamplingFields):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_TOP_NEEDS_LOGPROBS)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    add_generation_prompt: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, top, info: ValidationInfo):
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs=true")
        return top


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ---- response bodies: documentation of what the serving classes send (``/openapi.json``)
class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(BaseModel):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: dict[Literal["content"], list[ChatLogprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def server_schema(schema: dict, limits: dict) -> dict:
    """Write the server's limits into an OpenAPI document's request schemas: token ids below ``vocab_size``,
    ``logprobs`` / ``top_logprobs`` at most ``max_logprobs`` (what the validators check with the same context)."""
    schemas = schema["components"]["schemas"]

    def cap(node):
        if isinstance(node, dict):
            if node.get("type") == "integer":  # in ``prompt`` every integer is a token id
                node["maximum"] = limits["vocab_size"] - 1
            for value in node.values():
                cap(value)
        elif isinstance(node, list):
            for value in node:
                cap(value)

    for name, field in (("CompletionRequest", "logprobs"), ("ChatCompletionRequest", "top_logprobs")):
        for option in schemas[name]["properties"][field].get("anyOf", []):
            if option.get("type") == "integer":
                option["maximum"] = limits["max_logprobs"]
    cap(schemas["CompletionRequest"]["properties"]["prompt"])
    return schema
