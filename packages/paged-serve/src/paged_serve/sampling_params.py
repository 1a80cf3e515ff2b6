"""``SamplingParams`` (vLLM ``vllm/sampling_params.py``): how one request samples, when it stops, what it returns.

Field names and defaults are vLLM's. Every value is checked at construction and a bad one raises ``ValueError``
naming the field, so the server can answer 400 before the request reaches the engine.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

_SAMPLING_EPS = 1e-5
_INT64 = (-(2**63), 2**63 - 1)


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2
    BEAM = 3


class RequestOutputKind(enum.Enum):
    """What ``LLMEngine.step`` reports for a request (vLLM v1): everything so far, only the new part, or the end."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    logit_bias: dict[int, float] | None = None
    detokenize: bool = True
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self):
        best_of_given = self.best_of is not None
        if self.best_of is None:
            self.best_of = self.n
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        ids = list(self.stop_token_ids or [])
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"stop_token_ids must be a list of token ids (ints), got {self.stop_token_ids!r}")
        self.stop_token_ids = ids
        if self.logit_bias is not None:
            bias = self.logit_bias
            ok = isinstance(bias, dict) and all(
                isinstance(k, int) and not isinstance(k, bool) and k >= 0 and isinstance(v, (int, float))
                for k, v in bias.items()
            )
            if not ok:
                raise ValueError(f"logit_bias must map token ids (ints >= 0) to numbers, got {bias!r}")
            self.logit_bias = {k: float(v) for k, v in bias.items()}
        if self.top_k == 0:  # OpenAI clients send 0 for "off"; vLLM accepts it as -1
            self.top_k = -1
        self._verify_args()
        if self.use_beam_search:
            self._verify_beam_search()
        elif self.temperature < _SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, -1, 0.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling (temperature 0), got {self.n}")
            if best_of_given and self.best_of > 1:
                raise ValueError(f"best_of must be 1 when using greedy sampling (temperature 0), got {self.best_of}")
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify_args(self) -> None:
        def check(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        check(isinstance(self.n, int) and self.n >= 1, "n", "an int >= 1")
        check(isinstance(self.best_of, int) and self.best_of >= self.n, "best_of", f"an int >= n ({self.n})")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]")
        check(self.repetition_penalty > 0.0, "repetition_penalty", "> 0")
        check(self.temperature >= 0.0, "temperature", ">= 0")
        check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]")
        check(isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 1), "top_k", "-1 (off) or >= 1")
        check(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]")
        check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            "max_tokens",
            "None or an int >= 1",
        )
        check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens", "an int >= 0")
        if self.max_tokens is not None:
            check(self.min_tokens <= self.max_tokens, "min_tokens", f"<= max_tokens ({self.max_tokens})")
        check(
            self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
            "logprobs",
            "None or an int >= 0",
        )
        check(
            self.seed is None or (isinstance(self.seed, int) and _INT64[0] <= self.seed <= _INT64[1]),
            "seed",
            "None or an int in the int64 range",
        )
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings")
        check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "token ids >= 0")
        check(self.length_penalty == self.length_penalty, "length_penalty", "a number")
        check(isinstance(self.output_kind, RequestOutputKind), "output_kind", "a RequestOutputKind")

    def _verify_beam_search(self) -> None:
        if self.best_of == 1:
            raise ValueError(f"best_of (the beam width) must be > 1 with beam search, got {self.best_of}")
        if self.temperature > _SAMPLING_EPS:
            raise ValueError(f"temperature must be 0 with beam search, got {self.temperature}")
        if self.top_p < 1.0 - _SAMPLING_EPS or self.top_k != -1 or self.min_p > 0:
            raise ValueError("top_p, top_k and min_p must be off (1.0, -1, 0.0) with beam search")
        if self.stop:
            raise ValueError("stop strings are not supported with beam search (use stop_token_ids)")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")

    @property
    def sampling_type(self) -> SamplingType:
        if self.use_beam_search:
            return SamplingType.BEAM
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM_SEED if self.seed is not None else SamplingType.RANDOM

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    def update_from_generation_config(self, eos_token_ids: set[int]) -> None:
        """Stop at every EOS id the model declares (generation_config.json may list several), unless ignore_eos."""
        if not self.ignore_eos:
            self._all_stop_token_ids |= set(eos_token_ids)

    def clone(self) -> SamplingParams:
        import copy

        return copy.deepcopy(self)
