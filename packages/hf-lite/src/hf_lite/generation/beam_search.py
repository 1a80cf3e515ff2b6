"""Vectorised beam search and beam sampling, with transformers' semantics (``GenerationMixin._beam_search``).

Per step, every batch item scores ``num_beams x vocab`` continuations and keeps the top
``max(2, 1 + n_eos) * num_beams`` of them, so that enough non-finished candidates survive even when several hit EOS.
Candidates that hit a stopping criterion compete, length-normalised by ``len ** length_penalty``, for the
``num_beams`` finished slots; the others become the next running beams. ``early_stopping``: True stops a batch item
once ``num_beams`` hypotheses finished; False stops when the best running beam (at its current length) cannot beat the
worst finished one; "never" assumes the best possible length (``max_length`` when length_penalty > 0).
"""

from __future__ import annotations

import torch

from ..cache_utils import DynamicCache
from .outputs import GenerateBeamDecoderOnlyOutput

_NEG = -1.0e9


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Select along the beam axis (dim 1) of a (batch, beams, ...) tensor."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(tensor.shape[0] * tensor.shape[1], *tensor.shape[2:])


def beam_search(model, input_ids, attention_mask, position_ids, processors, criteria, gc):
    """``input_ids`` is already expanded to ``(batch * num_beams, prompt_len)``."""
    num_beams, max_length = gc.num_beams, gc.max_length
    length_penalty, early_stopping = gc.length_penalty, gc.early_stopping
    eos, pad = gc._eos_token_tensor, gc._pad_token_tensor
    batch = input_ids.shape[0] // num_beams
    prompt_len = cur_len = input_ids.shape[1]
    device = input_ids.device

    n_eos = eos.shape[0] if eos is not None else 0
    keep = max(2, 1 + n_eos) * num_beams
    top_mask = torch.arange(keep, device=device) < num_beams
    # transformers fills unused positions with pad (or the first EOS when pad is 0/absent), -1 without EOS.
    if eos is None:
        fill = -1
    else:
        fill = int(pad) if pad is not None and int(pad) != 0 else int(eos[0])

    running = torch.full((batch, num_beams, max_length), fill, dtype=torch.long, device=device)
    running[:, :, :cur_len] = input_ids.view(batch, num_beams, -1)
    sequences = running.clone()
    running_scores = torch.zeros(batch, num_beams, device=device)
    running_scores[:, 1:] = _NEG  # identical beams at start: only the first may expand
    beam_scores = torch.full((batch, num_beams), _NEG, device=device)
    finished = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    running_beam_idx = torch.full((batch, num_beams, max_length - cur_len), -1, dtype=torch.long, device=device)
    beam_indices = running_beam_idx.clone()
    all_scores = () if gc.return_dict_in_generate and gc.output_scores else None

    cache = DynamicCache() if gc.use_cache else None
    flat_running = input_ids
    step_ids, step_pos = input_ids, position_ids
    while True:
        out = model(input_ids=step_ids, attention_mask=attention_mask, position_ids=step_pos, past_key_values=cache,
                    use_cache=gc.use_cache, logits_to_keep=1, return_dict=True)
        logits = out.logits[:, -1].to(dtype=torch.float32, copy=True)
        log_probs = processors(flat_running, torch.log_softmax(logits, dim=-1))
        if all_scores is not None:
            all_scores += (log_probs.clone(),)
        vocab = log_probs.shape[-1]
        log_probs = (log_probs.view(batch, num_beams, vocab) + running_scores[:, :, None]).view(batch, -1)

        # 1. top-`keep` continuations per batch item (sampled without replacement for beam sampling)
        if gc.do_sample:
            idx = torch.multinomial(torch.softmax(log_probs, dim=-1), num_samples=keep)
            topk_lp = torch.gather(log_probs, 1, idx)
            topk_lp, order = topk_lp.sort(dim=-1, descending=True)
            idx = idx.gather(-1, order)
        else:
            topk_lp, idx = torch.topk(log_probs, k=keep)
        src_beam = idx // vocab
        cand_seqs = _gather(running, src_beam)
        cand_seqs[:, :, cur_len] = idx % vocab
        cand_beam_idx = _gather(running_beam_idx, src_beam)
        cand_beam_idx[:, :, cur_len - prompt_len] = src_beam + torch.arange(batch, device=device)[:, None] * num_beams

        hits = criteria(_flat(cand_seqs[:, :, : cur_len + 1]), all_scores).view(batch, keep)

        # 2. next running beams: best candidates that did not stop
        cand_running_lp = topk_lp + hits.float() * _NEG
        nxt = torch.topk(cand_running_lp, k=num_beams)[1]
        running = _gather(cand_seqs, nxt)
        running_scores = _gather(cand_running_lp, nxt)
        running_beam_idx = _gather(cand_beam_idx, nxt)

        # 3. finished hypotheses: only the top `num_beams` candidates may finish (as in transformers)
        just_finished = hits & top_mask[None, :]
        normed = topk_lp / ((cur_len + 1 - prompt_len) ** length_penalty)
        full = finished.all(dim=-1, keepdim=True) & (early_stopping is True)
        normed = normed + full.float() * _NEG + (~improvable).float() * _NEG + (~just_finished).float() * _NEG
        merged_scores = torch.cat([beam_scores, normed], dim=1)
        best = torch.topk(merged_scores, k=num_beams)[1]
        sequences = _gather(torch.cat([sequences, cand_seqs], dim=1), best)
        beam_scores = _gather(merged_scores, best)
        beam_indices = _gather(torch.cat([beam_indices, cand_beam_idx], dim=1), best)
        finished = _gather(torch.cat([finished, just_finished], dim=1), best)

        if cache is not None:
            cache.reorder_cache(_flat(running_beam_idx[..., cur_len - prompt_len]))
        cur_len += 1

        # 4. can any batch item still improve?
        if early_stopping == "never" and length_penalty > 0.0:
            best_len = max_length - prompt_len
        else:
            best_len = cur_len - prompt_len
        best_running = running_scores[:, :1] / (best_len**length_penalty)
        worst_finished = torch.where(finished, beam_scores.min(dim=1, keepdim=True)[0], torch.tensor(_NEG))
        improvable = improvable & (best_running > worst_finished).any(dim=-1, keepdim=True)
        open_beams = not (bool(finished.all()) and early_stopping is True)
        if not (bool(improvable.any()) and open_beams and not bool(hits.all())):
            break

        flat_running = _flat(running[:, :, :cur_len])
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        next_pos = position_ids[:, -1:] + 1
        position_ids = torch.cat([position_ids, next_pos], dim=-1)
        if cache is not None:
            step_ids, step_pos, cache = flat_running[:, -1:], next_pos, out.past_key_values
        else:
            step_ids, step_pos = flat_running, position_ids

    n = gc.num_return_sequences
    sequences = _flat(sequences[:, :n])
    beam_scores = _flat(beam_scores[:, :n])
    beam_indices = _flat(beam_indices[:, :n])
    generated = int((beam_indices + 1).bool().sum(dim=1).max())
    sequences = sequences[:, : prompt_len + generated]
    if gc.return_dict_in_generate:
        return GenerateBeamDecoderOnlyOutput(sequences=sequences,
                                             sequences_scores=beam_scores if gc.output_scores else None,
                                             scores=all_scores, beam_indices=beam_indices[:, :generated],
                                             past_key_values=cache)
    return sequences
