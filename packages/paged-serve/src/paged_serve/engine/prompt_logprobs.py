"""vLLM's ``prompt_logprobs``: each prompt token's logprob given the tokens before it (the first has none).

The model runner sends the rows that score a prompt token through the LM head after the sampled rows; this turns
their logits into one ``{token: Logprob}`` entry per prompt token, with its rank and the request's top-k, recorded
once on the group (a recomputed prefill scores nothing new).
"""

from __future__ import annotations

import torch

from paged_serve.core.sequence import Logprob


def record_prompt_logprobs(requests: dict, rows: list, logits: torch.Tensor) -> None:
    """``rows[i]`` is ``(group metadata, index of the prompt token row i scores)``; ``requests`` maps request ids
    to their ``RequestState``."""
    logprobs = logits.float().log_softmax(dim=-1)
    targets = torch.tensor([requests[m.request_id].group.prompt_token_ids[i] for m, i in rows])
    chosen = logprobs.gather(1, targets.to(logprobs.device)[:, None])
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    top = max(requests[m.request_id].params.prompt_logprobs for m, _ in rows)
    values, indices = logprobs.topk(top) if top else (None, None)
    for row, ((meta, index), rank) in enumerate(zip(rows, ranks)):
        group = requests[meta.request_id].group
        recorded = group.prompt_logprobs = group.prompt_logprobs or [None]
        if index != len(recorded):
            continue
        entry = {int(targets[row]): Logprob(float(chosen[row]), rank)}
        k = requests[meta.request_id].params.prompt_logprobs
        if k:
            for r, (v, t) in enumerate(zip(values[row, :k].tolist(), indices[row, :k].tolist()), start=1):
                entry.setdefault(t, Logprob(v, r))
        recorded.append(entry)
