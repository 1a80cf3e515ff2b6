"""Sampled tokens -> sequences (vLLM ``engine/output_processor/single_step.py``).

A request's first sample draws ``best_of`` tokens: the parent sequence keeps the first and is forked (sharing
every KV block, copy-on-write) for the others. Each appended token is checked for a stop; a finished sequence's
blocks are freed at once. Beam-search groups go to the beam search plugged in (``_compat/beam_search.py``). What
a request reports (``RequestOutput``: text, deltas, the best ``n`` of ``best_of``) is made from its state in
``outputs.py``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import torch

from paged_serve.core.scheduler import Scheduler
from paged_serve.core.sequence import Sequence, SequenceGroup
from paged_serve.engine.stop_checker import StopChecker
from paged_serve.model_executor.layers.sampler import Sampler, SampleResult, SampleRow
from paged_serve.outputs import RequestOutput, make_request_output
from paged_serve.sampling_params import SamplingParams
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
    beam_search_processor = None  # v0's in-engine beam search plugs in here (``_compat/beam_search.py``)

    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, stop_checker: StopChecker, seq_counter):
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.stop_checker = stop_checker
        self.seq_counter: itertools.count = seq_counter
        self.beam_search = self.beam_search_processor(self) if self.beam_search_processor else None

    def process_outputs(self, requests: dict[str, RequestState], sampled_seqs, logits: torch.Tensor,
                        sampler: Sampler) -> None:  # fmt: skip
        """Row ``i`` of ``logits`` is ``sampled_seqs[i]``'s next-token distribution: sample and append it."""
        rows, plain, beams = [], [], {}
        for i, (meta, seq) in enumerate(sampled_seqs):
            state = requests[meta.request_id]
            if state.params.use_beam_search:
                beams.setdefault(meta.request_id, []).append((i, seq))
                continue
            first = seq.get_output_len() == 0 and state.group.num_seqs() == 1
            num = state.params.best_of if first else 1
            rows.append(SampleRow(state.params, seq.prompt_token_ids, seq.output_token_ids, state.generator, num))
            plain.append((i, state, seq))
        if plain:
            index = torch.tensor([i for i, _, _ in plain], device=logits.device)
            for (_, state, seq), result in zip(plain, sampler(logits[index], rows)):
                self.process_sample(state, seq, result)
        for request_id, members in beams.items():
            index = torch.tensor([i for i, _ in members], device=logits.device)
            self.beam_search.step(requests[request_id], [s for _, s in members], logits[index], sampler)

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

    def detokenizer(self, state: RequestState, seq: Sequence) -> IncrementalDetokenizer:
        if seq.seq_id not in state.detokenizers:
            state.detokenizers[seq.seq_id] = IncrementalDetokenizer(
                self.tokenizer, seq.prompt_token_ids, state.params.skip_special_tokens
            )
        return state.detokenizers[seq.seq_id]

    def make_output(self, state: RequestState) -> RequestOutput | None:
        return make_request_output(state, self)
