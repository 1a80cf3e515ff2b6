"""``SamplingParams`` (vLLM ``vllm/sampling_params.py``): how one request samples, when it stops, what it returns.

Field names and defaults are vLLM's. Every value is checked at construction and a bad one raises ``ValueError``
naming the field, so the server can answer 400 before the request reaches the engine.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from paged_serve._infra import param_checks

_SAMPLING_EPS = 1e-5


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
        param_checks.normalize_lists(self)  # stop -> list of str, stop_token_ids -> list, logit_bias -> floats
        if self.top_k == 0:  # OpenAI clients send 0 for "off"; vLLM accepts it as -1
            self.top_k = -1
        param_checks.verify_args(self, RequestOutputKind)  # each field in range, or ValueError naming it
        if self.use_beam_search:
            param_checks.verify_beam_search(self, _SAMPLING_EPS)
        elif self.temperature < _SAMPLING_EPS:
            self.top_p, self.top_k, self.min_p = 1.0, -1, 0.0
            if self.n > 1:
                raise ValueError(f"n must be 1 when using greedy sampling (temperature 0), got {self.n}")
            if best_of_given and self.best_of > 1:
                raise ValueError(f"best_of must be 1 when using greedy sampling (temperature 0), got {self.best_of}")
        self._all_stop_token_ids = set(self.stop_token_ids)

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


@dataclass
class BeamSearchParams:
    """vLLM's ``BeamSearchParams``: the arguments of ``LLM.beam_search`` (beam search run over ``generate``)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False
