"""Beam search on fork / free (vLLM v0's in-engine beam search, ``SamplingParams(use_beam_search=True)``, an option
vLLM has since moved out of the engine), scored as transformers' ``_beam_search``. It plugs into the core's
``OutputProcessor.beam_search_processor``, which hands it the beam-search groups of each step.

Each live beam is a ``Sequence`` of the request's group, so beams share their common prefix's KV blocks. A step
takes the top ``K = max(2, 1 + #eos) * width`` continuations over all beams by accumulated log-probability (log
softmax, then penalties, as transformers' logits processors see it). Of the first ``width`` of them, those ending
in EOS (or at the length limit) become finished hypotheses scored ``sum logprob / generated_len ** length_penalty``;
the best ``width`` that did not end continue: a parent chosen once keeps its sequence, chosen again it is forked
(copy-on-write), not chosen it is freed. ``early_stopping`` (True / False / "never") decides when the request is
done, with transformers' heuristic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paged_serve.core.sequence import Logprob, Sequence, SequenceStatus
from paged_serve.engine.output_processor import OutputProcessor
from paged_serve.model_executor.layers.sampler import Sampler, SampleRow

_NEG = -1.0e9


@dataclass
class BeamState:
    finished: list[tuple[float, Sequence]] = field(default_factory=list)  # best first, at most `width`
    order: list[int] = field(default_factory=list)  # live beams' seq ids in rank order
    improvable: bool = True


class BeamSearchProcessor:
    def __init__(self, output_processor):
        self.out = output_processor
        self.scheduler = output_processor.scheduler

    def step(self, state, seqs: list[Sequence], logits: torch.Tensor, sampler: Sampler) -> None:
        params = state.params
        if state.beam is None:
            state.beam = BeamState(order=[seqs[0].seq_id])
        beam = state.beam
        width, lp = params.best_of, params.length_penalty
        rank = {sid: i for i, sid in enumerate(beam.order)}
        order = sorted(range(len(seqs)), key=lambda i: rank.get(seqs[i].seq_id, len(rank)))
        seqs = [seqs[i] for i in order]
        logits = logits[torch.tensor(order, device=logits.device)]
        rows = [SampleRow(params, s.prompt_token_ids, s.output_token_ids) for s in seqs]
        logprobs = sampler.process_logits(logits.float().log_softmax(dim=-1), rows)
        cum = torch.tensor([s.cumulative_logprob for s in seqs], device=logprobs.device)
        acc = (logprobs + cum[:, None]).flatten()
        vocab = logprobs.shape[1]
        k = min(max(2, 1 + len(params.all_stop_token_ids)) * width, acc.numel())
        top = acc.topk(k)
        cands = [(float(v), i // vocab, i % vocab) for v, i in zip(top.values.tolist(), top.indices.tolist())]
        gen_len = seqs[0].get_output_len() + 1
        max_new = params.max_tokens or self.out.stop_checker.max_model_len
        max_new = min(max_new, self.out.stop_checker.max_model_len - seqs[0].get_prompt_len())
        at_limit = gen_len >= max_new
        hits = [at_limit or t in params.all_stop_token_ids for _, _, t in cands]

        # finished hypotheses: among the first `width` candidates, unless the beam set is closed
        full = len(beam.finished) == width and params.early_stopping is True
        if beam.improvable and not full:
            new = [
                (v / gen_len**lp, self._hypothesis(seqs[p], t, v, params, t in params.all_stop_token_ids))
                for (v, p, t), hit in zip(cands[:width], hits[:width])
                if hit
            ]
            merged = beam.finished + new
            beam.finished = sorted(merged, key=lambda x: -x[0])[:width]  # stable: earlier ties first, as topk

        # the best `width` continuations that did not end keep running
        running = sorted(range(len(cands)), key=lambda j: -(cands[j][0] + (_NEG if hits[j] else 0.0)))[:width]
        running = [j for j in running if not hits[j]]
        best_running = max((cands[j][0] for j in running), default=_NEG)

        # transformers' early-stop heuristic
        if params.early_stopping == "never" and lp > 0.0:
            best_len = max_new
        else:
            best_len = gen_len
        worst = min(s for s, _ in beam.finished) if len(beam.finished) == width else _NEG
        beam.improvable = beam.improvable and best_running / best_len**lp > worst
        done = not beam.improvable or not running
        done = done or (len(beam.finished) == width and params.early_stopping is True)
        if done:
            self._finish(state, seqs, beam)
            return
        self._continue(state, seqs, [cands[j] for j in running], beam)

    @staticmethod
    def _hypothesis(parent: Sequence, token: int, acc: float, params, eos: bool) -> Sequence:
        hyp = parent.fork(-1)
        hyp.append_token_id(token, {token: Logprob(acc - parent.cumulative_logprob)})
        hyp.status = SequenceStatus.FINISHED_STOPPED if eos else SequenceStatus.FINISHED_LENGTH_CAPPED
        return hyp

    def _continue(self, state, seqs: list[Sequence], chosen: list[tuple[float, int, int]], beam: BeamState) -> None:
        group = state.group
        by_parent: dict[int, list[tuple[float, int]]] = {}
        for acc, p, t in chosen:
            by_parent.setdefault(p, []).append((acc, t))
        new_order: list[tuple[int, Sequence]] = []
        rank = {(p, t): n for n, (_, p, t) in enumerate(chosen)}
        for p, parent in enumerate(seqs):
            picks = by_parent.get(p)
            if not picks:
                parent.status = SequenceStatus.FINISHED_ABORTED  # a dropped beam
                self.scheduler.free_seq(parent)
                group.remove(parent.seq_id)
                continue
            forks = []
            for acc, t in picks[1:]:
                child = parent.fork(next(self.out.seq_counter))
                self.scheduler.fork_seq(parent, child)
                group.add(child)
                forks.append((child, acc, t))
            start = parent.cumulative_logprob
            acc0, t0 = picks[0]
            for s, acc, t in [(parent, acc0, t0), *forks]:
                s.append_token_id(t, {t: Logprob(acc - start)})
            new_order += [(rank[(p, t)], s) for s, _, t in [(parent, acc0, t0), *forks]]
        beam.order = [s.seq_id for _, s in sorted(new_order, key=lambda x: x[0])]

    def _finish(self, state, seqs: list[Sequence], beam: BeamState) -> None:
        group = state.group
        for seq in seqs:
            self.scheduler.free_seq(seq)
            group.remove(seq.seq_id)
        for n, (_, hyp) in enumerate(beam.finished):
            hyp.seq_id = next(self.out.seq_counter)
            group.add(hyp)
            state.index[hyp.seq_id] = n


OutputProcessor.beam_search_processor = BeamSearchProcessor
