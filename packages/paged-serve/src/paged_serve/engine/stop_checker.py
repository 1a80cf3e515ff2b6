"""``StopChecker`` (vLLM ``engine/output_processor/stop_checker.py``): has a sequence just finished, and why.

Checked after each appended token, in vLLM's order: a stop token (EOS unless ``ignore_eos``, or one of
``stop_token_ids``) once ``min_tokens`` are out; a stop string in the newly decoded text (the text is cut before
it, or after it with ``include_stop_str_in_output``); ``max_tokens``; the context length (a sequence may reach
``max_model_len + 1`` tokens: the last one is sampled from the ``max_model_len``-th and needs no KV slot).
"""

from __future__ import annotations

from paged_serve.core.sequence import Sequence, SequenceStatus
from paged_serve.sampling_params import SamplingParams
from paged_serve.transformers_utils.tokenizer import IncrementalDetokenizer


class StopChecker:
    def __init__(self, max_model_len: int):
        self.max_model_len = max_model_len

    def maybe_stop_sequence(
        self, seq: Sequence, params: SamplingParams, detokenizer: IncrementalDetokenizer | None
    ) -> None:
        """Set ``seq.status`` (and ``stop_reason``/``output_text``) when the newest token ends it."""
        num_out = seq.get_output_len()
        last = seq.get_last_token_id()
        if num_out >= params.min_tokens and last in params.all_stop_token_ids:
            seq.status = SequenceStatus.FINISHED_STOPPED
            seq.stop_reason = last if last in params.stop_token_ids else None
            return
        if params.stop and detokenizer is not None and num_out >= params.min_tokens:
            previous = len(seq.output_text)
            text = detokenizer.text(seq.output_token_ids)
            longest = max(len(s) for s in params.stop)
            window_start = max(0, previous - longest + 1)
            hits = [(text.find(s, window_start), s) for s in params.stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                index, stop = min(hits)
                end = index + len(stop) if params.include_stop_str_in_output else index
                seq.output_text = text[:end]
                seq.status = SequenceStatus.FINISHED_STOPPED
                seq.stop_reason = stop
                return
            seq.output_text = text
        if params.max_tokens is not None and num_out >= params.max_tokens:
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
        elif seq.get_len() > self.max_model_len:  # vLLM v0: the last sampled token is never fed back
            seq.status = SequenceStatus.FINISHED_LENGTH_CAPPED
