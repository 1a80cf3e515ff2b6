"""``RequestOutput`` / ``CompletionOutput`` (vLLM ``vllm/outputs.py``): what a request has produced so far."""

from __future__ import annotations

from dataclasses import dataclass, field

from paged_serve.core.sequence import Logprob, RequestMetrics


@dataclass
class CompletionOutput:
    """One generated sequence: ``finish_reason`` is "stop", "length", "abort" or None while running;
    ``stop_reason`` the stop string or stop token id that ended it (None for EOS or length)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    ignored_reason: str | None = None
    extra: dict = field(default_factory=dict)
