"""``RequestOutput`` / ``CompletionOutput`` (vLLM ``vllm/outputs.py``): what a request has produced so far.

``make_request_output`` builds one from a request's engine state (vLLM v0's ``RequestOutput.from_seq_group``): the
final text (a stop token's text left out), the delta since the last report in ``DELTA`` mode (holding back what
may still become a stop string), the best ``n`` of ``best_of`` sequences or of a beam search, prompt logprobs once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from paged_serve.core.sequence import Logprob, RequestMetrics, SequenceStatus
from paged_serve.sampling_params import RequestOutputKind


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


def _final_text(state, seq, processor) -> str:
    if not state.params.detokenize or processor.tokenizer is None:
        return ""
    if seq.is_finished() and isinstance(seq.stop_reason, str):
        return seq.output_text  # cut at the stop string already
    tokens = seq.output_token_ids
    if seq.status == SequenceStatus.FINISHED_STOPPED and not state.params.include_stop_str_in_output:
        # ended by a stop token (EOS or stop_token_ids): its text is left out, and so is a partial character in
        # front of it (vLLM's incremental detokenizer never emits one)
        return processor.detokenizer(state, seq).text(tokens[:-1])
    return processor.detokenizer(state, seq).text(tokens, final=seq.is_finished())


def _prompt_logprobs(state):
    """Complete prompt logprobs once the prefill is done; in DELTA mode only in the first output after it."""
    recorded = state.group.prompt_logprobs
    if recorded is None and state.params.prompt_logprobs is not None and len(state.group.prompt_token_ids) == 1:
        recorded = [None]  # nothing scores a prompt's first token
    if recorded is None or len(recorded) < len(state.group.prompt_token_ids):
        return None
    if state.params.output_kind == RequestOutputKind.DELTA:
        if state.prompt_reported:
            return None
        state.prompt_reported = True
    return recorded


def make_request_output(state, processor) -> RequestOutput | None:
    """The output of one request (``engine.output_processor.RequestState``), or None when its kind reports
    nothing now (``FINAL_ONLY`` before the end); ``processor`` detokenizes."""
    group, params = state.group, state.params
    finished = group.is_finished()
    kind = params.output_kind
    if kind == RequestOutputKind.FINAL_ONLY and not finished:
        return None
    seqs = sorted(group.get_seqs(), key=lambda s: state.index.get(s.seq_id, 0))
    if params.use_beam_search or params.best_of > params.n:
        key = (lambda s: s.get_beam_search_score(params.length_penalty)) if params.use_beam_search else None
        seqs = sorted(seqs, key=key or (lambda s: s.cumulative_logprob), reverse=True)[: params.n]
    outputs = []
    for rank, seq in enumerate(seqs):
        text = _final_text(state, seq, processor)
        tokens, logprobs = seq.output_token_ids, seq.output_logprobs if params.logprobs is not None else None
        if kind == RequestOutputKind.DELTA:
            hold = (
                0
                if seq.is_finished() or not params.stop or params.include_stop_str_in_output
                else (max(len(s) for s in params.stop) - 1)
            )  # a stop string may still be completing: do not stream its first characters
            start_tok = state.reported_tokens.get(seq.seq_id, 0)
            start_txt = state.reported_text.get(seq.seq_id, 0)
            end_txt = max(start_txt, len(text) - hold)
            state.reported_tokens[seq.seq_id] = len(tokens)
            state.reported_text[seq.seq_id] = end_txt
            text, tokens = text[start_txt:end_txt], tokens[start_tok:]
            logprobs = logprobs[start_tok:] if logprobs is not None else None
        index = rank if params.best_of > params.n or params.use_beam_search else state.index.get(seq.seq_id, 0)
        outputs.append(
            CompletionOutput(
                index=index,
                text=text,
                token_ids=list(tokens),
                cumulative_logprob=seq.cumulative_logprob,
                logprobs=list(logprobs) if logprobs is not None else None,
                finish_reason=SequenceStatus.get_finished_reason(seq.status),
                stop_reason=seq.stop_reason,
            )
        )
    if finished:
        group.metrics.finished_time = group.metrics.finished_time or time.time()
    return RequestOutput(
        request_id=group.request_id,
        prompt=group.prompt,
        prompt_token_ids=group.prompt_token_ids,
        outputs=outputs,
        finished=finished,
        metrics=group.metrics,
        num_cached_tokens=group.num_cached_tokens,
        prompt_logprobs=_prompt_logprobs(state),
        ignored_reason=group.ignored_reason,
    )
