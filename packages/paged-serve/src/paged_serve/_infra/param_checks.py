"""The range checks of ``SamplingParams`` (vLLM's ``SamplingParams._verify_args`` / ``_verify_beam_search``), called
once from its ``__post_init__``: every field in range, or a ``ValueError`` naming the field and its value."""

from __future__ import annotations

_INT64 = (-(2**63), 2**63 - 1)


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def normalize_lists(params) -> None:
    """``stop`` as a list of strings, ``stop_token_ids`` as a list of ints, ``logit_bias`` as {id: float}."""
    params.stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
    ids = list(params.stop_token_ids or [])
    if not all(_is_id(t) for t in ids):
        raise ValueError(f"stop_token_ids must be a list of token ids (ints), got {params.stop_token_ids!r}")
    params.stop_token_ids = ids
    bias = params.logit_bias
    if bias is not None:
        entries_ok = all(_is_id(k) and k >= 0 and isinstance(v, (int, float)) for k, v in dict(bias).items())
        if not (isinstance(bias, dict) and entries_ok):
            raise ValueError(f"logit_bias must map token ids (ints >= 0) to numbers, got {bias!r}")
        params.logit_bias = {k: float(v) for k, v in bias.items()}


def verify_args(params, output_kind_type: type) -> None:
    def check(ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise ValueError(f"{name} must be {rule}, got {getattr(params, name)!r}")

    check(isinstance(params.n, int) and params.n >= 1, "n", "an int >= 1")
    check(isinstance(params.best_of, int) and params.best_of >= params.n, "best_of", f"an int >= n ({params.n})")
    check(-2.0 <= params.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]")
    check(-2.0 <= params.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]")
    check(params.repetition_penalty > 0.0, "repetition_penalty", "> 0")
    check(params.temperature >= 0.0, "temperature", ">= 0")
    check(0.0 < params.top_p <= 1.0, "top_p", "in (0, 1]")
    check(isinstance(params.top_k, int) and (params.top_k == -1 or params.top_k >= 1), "top_k", "-1 (off) or >= 1")
    check(0.0 <= params.min_p <= 1.0, "min_p", "in [0, 1]")
    check(
        params.max_tokens is None or (isinstance(params.max_tokens, int) and params.max_tokens >= 1),
        "max_tokens",
        "None or an int >= 1",
    )
    check(isinstance(params.min_tokens, int) and params.min_tokens >= 0, "min_tokens", "an int >= 0")
    if params.max_tokens is not None:
        check(params.min_tokens <= params.max_tokens, "min_tokens", f"<= max_tokens ({params.max_tokens})")
    check(
        params.logprobs is None or (isinstance(params.logprobs, int) and params.logprobs >= 0),
        "logprobs",
        "None or an int >= 0",
    )
    check(
        params.seed is None or (isinstance(params.seed, int) and _INT64[0] <= params.seed <= _INT64[1]),
        "seed",
        "None or an int in the int64 range",
    )
    check(all(isinstance(s, str) and s for s in params.stop), "stop", "non-empty strings")
    check(all(t >= 0 for t in params.stop_token_ids), "stop_token_ids", "token ids >= 0")
    check(params.length_penalty == params.length_penalty, "length_penalty", "a number")
    check(isinstance(params.output_kind, output_kind_type), "output_kind", "a RequestOutputKind")


def verify_beam_search(params, eps: float) -> None:
    if params.best_of == 1:
        raise ValueError(f"best_of (the beam width) must be > 1 with beam search, got {params.best_of}")
    if params.temperature > eps:
        raise ValueError(f"temperature must be 0 with beam search, got {params.temperature}")
    if params.top_p < 1.0 - eps or params.top_k != -1 or params.min_p > 0:
        raise ValueError("top_p, top_k and min_p must be off (1.0, -1, 0.0) with beam search")
    if params.stop:
        raise ValueError("stop strings are not supported with beam search (use stop_token_ids)")
    if params.early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {params.early_stopping!r}")
