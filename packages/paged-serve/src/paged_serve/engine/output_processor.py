"""Sampled tokens -> sequences (vLLM ``engine/output_processor/single_step.py``) and -> ``RequestOutput`` s.

A request's first sample draws ``best_of`` tokens: the parent sequence keeps the first and is forked (sharing
every KV block, copy-on-write) for the others. Each appended token is checked for a stop; a finished sequence's
blocks are freed at once. Beam-search groups go to ``BeamSearchProcessor`` instead.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from paged_serve.core.scheduler import Scheduler
from paged_serve.core.sequence import Sequence, SequenceGroup, SequenceStatus
from paged_serve.engine.stop_checker import StopChecker
from paged_serve.model_executor.layers.sampler import SampleResult
from paged_serve.outputs import CompletionOutput, RequestOutput
from paged_serve.sampling_params import RequestOutputKind, SamplingParams
from paged_serve.transformers_utils.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class RequestState:
    """Engine-side state of one request: its group, seeded generator, detokenizers, what was already reported."""

    group: SequenceGroup
    params: SamplingParams
    generator: torch.Generator | None
    detokenizers: dict[int, IncrementalDetokenizer] = field(default_factory=dict)
    index: dict[int, int] = field(default_factory=dict)  # seq_id -> CompletionOutput.index
    reported_tokens: dict[int, int] = field(default_factory=dict)
    reported_text: dict[int, int] = field(default_factory=dict)
    beam: object | None = None  # BeamState of a beam-search request
    prompt_reported: bool = False  # DELTA outputs: prompt_logprobs already sent


class OutputProcessor:
    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, stop_checker: StopChecker, seq_counter):
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.stop_checker = stop_checker
        self.seq_counter: itertools.count = seq_counter

    def detokenizer(self, state: RequestState, seq: Sequence) -> IncrementalDetokenizer:
        if seq.seq_id not in state.detokenizers:
            state.detokenizers[seq.seq_id] = IncrementalDetokenizer(
                self.tokenizer, seq.prompt_token_ids, state.params.skip_special_tokens
            )
        return state.detokenizers[seq.seq_id]

    def process_sample(self, state: RequestState, seq: Sequence, result: SampleResult) -> None:
        group = state.group
        children = []
        for token, logprobs in zip(result.token_ids[1:], result.logprobs[1:]):
            child = seq.fork(next(self.seq_counter))
            self.scheduler.fork_seq(seq, child)
            group.add(child)
            state.index[child.seq_id] = len(state.index)
            children.append((child, token, logprobs))
        for s, token, logprobs in [(seq, result.token_ids[0], result.logprobs[0]), *children]:
            s.append_token_id(token, logprobs)
            if group.metrics.first_token_time is None:
                group.metrics.first_token_time = time.time()
            self.check_stop(state, s)

    def check_stop(self, state: RequestState, seq: Sequence) -> None:
        detok = self.detokenizer(state, seq) if state.params.stop and state.params.detokenize else None
        self.stop_checker.maybe_stop_sequence(seq, state.params, detok)
        if seq.is_finished():
            self.scheduler.free_seq(seq)

    # -------------------------------------------------------------- outputs
    def _final_text(self, state: RequestState, seq: Sequence) -> str:
        if not state.params.detokenize or self.tokenizer is None:
            return ""
        if seq.is_finished() and isinstance(seq.stop_reason, str):
            return seq.output_text  # cut at the stop string already
        tokens = seq.output_token_ids
        if seq.status == SequenceStatus.FINISHED_STOPPED and not state.params.include_stop_str_in_output:
            # ended by a stop token (EOS or stop_token_ids): its text is left out, and so is a partial character
            # in front of it (vLLM's incremental detokenizer never emits one)
            return self.detokenizer(state, seq).text(tokens[:-1])
        return self.detokenizer(state, seq).text(tokens, final=seq.is_finished())

    @staticmethod
    def _prompt_logprobs(state: RequestState):
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

    def make_output(self, state: RequestState) -> RequestOutput | None:
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
            text = self._final_text(state, seq)
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
            prompt_logprobs=self._prompt_logprobs(state),
            ignored_reason=group.ignored_reason,
        )
