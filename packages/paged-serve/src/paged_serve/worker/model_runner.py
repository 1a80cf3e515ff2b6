"""``ModelRunner`` (vLLM ``worker/model_runner.py``): scheduled groups -> one packed forward pass -> logits.

Every scheduled token of every sequence goes into one batch without padding: prefill tokens first (each
sequence's uncomputed tokens, or the chunk the scheduler gave it), then one token per decoding sequence. Each
token's cache slot comes from its sequence's block table; only the rows whose next token is sampled (the last
token of a finished prefill, every decode), and the prompt rows of requests asking for ``prompt_logprobs``, go
through the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paged_serve.core.sequence import Sequence, SequenceGroupMetadata
from paged_serve.model_executor.layers.attention import AttentionMetadata


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    sample_indices: torch.Tensor
    sampled_seqs: list[tuple[SequenceGroupMetadata, Sequence]]
    prompt_indices: torch.Tensor | None = None  # rows whose logits score the next prompt token (prompt_logprobs)
    prompt_rows: list[tuple[SequenceGroupMetadata, int]] | None = None  # (group, index of the scored token)


def _pad(rows: list[list[int]], device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32, device=device)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, block_size: int, device: torch.device):
        self.model = model
        self.block_size = block_size
        self.device = device

    def prepare_input(self, metas: list[SequenceGroupMetadata]) -> ModelInput:
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefill_tables, prefill_lens, starts = [], [], [0]
        decode_tables, decode_lens = [], []
        sample_indices: list[int] = []
        sampled = []
        prompt_indices: list[int] = []
        prompt_rows: list[tuple[SequenceGroupMetadata, int]] = []
        bs = self.block_size
        for prefill in (True, False):  # prefill tokens first, then decodes
            for meta in metas:
                if meta.is_prompt != prefill:
                    continue
                score_prompt = prefill and getattr(meta.sampling_params, "prompt_logprobs", None) is not None
                for seq_id, seq in meta.seq_data.items():
                    table = meta.block_tables[seq_id]
                    start = seq.num_computed_tokens
                    count = min(meta.token_chunk_size, seq.get_num_uncomputed_tokens()) if prefill else 1
                    ids = seq.get_token_ids()
                    for pos in range(start, start + count):
                        tokens.append(ids[pos])
                        positions.append(pos)
                        slots.append(table[pos // bs] * bs + pos % bs)
                        if score_prompt and pos + 1 < seq.get_prompt_len():
                            prompt_indices.append(len(tokens) - 1)
                            prompt_rows.append((meta, pos + 1))
                    score_prompt = False  # the prompt is the same in every sequence of the group
                    if prefill:
                        prefill_tables.append(table)
                        prefill_lens.append(start + count)
                        starts.append(starts[-1] + count)
                    else:
                        decode_tables.append(table)
                        decode_lens.append(start + count)
                    if meta.do_sample and start + count == seq.get_len():
                        sample_indices.append(len(tokens) - 1)
                        sampled.append((meta, seq))
        num_prefill = starts[-1]
        dev = self.device
        i32 = dict(dtype=torch.int32, device=dev)
        md = AttentionMetadata(
            num_prefill_tokens=num_prefill,
            num_decode_tokens=len(tokens) - num_prefill,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        )
        if num_prefill:
            md.prefill_block_tables = _pad(prefill_tables, dev)
            md.query_start_loc = torch.tensor(starts, **i32)
            md.prefill_context_lens = torch.tensor(prefill_lens, **i32)
            md.max_query_len = max(b - a for a, b in zip(starts, starts[1:]))
        if decode_tables:
            md.decode_block_tables = _pad(decode_tables, dev)
            md.decode_context_lens = torch.tensor(decode_lens, **i32)
        return ModelInput(
            input_ids=torch.tensor(tokens, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            attn_metadata=md,
            sample_indices=torch.tensor(sample_indices, dtype=torch.long, device=dev),
            sampled_seqs=sampled,
            prompt_indices=torch.tensor(prompt_indices, dtype=torch.long, device=dev) if prompt_rows else None,
            prompt_rows=prompt_rows or None,
        )

    @torch.inference_mode()
    def execute_model(self, model_input: ModelInput, kv_caches) -> torch.Tensor:
        """Logits ``[num_sampled + num_prompt_rows, vocab]``: the sampled rows, then the rows scoring prompt tokens."""
        hidden = self.model(model_input.input_ids, model_input.positions, kv_caches, model_input.attn_metadata)
        rows = model_input.sample_indices
        if model_input.prompt_indices is not None:
            rows = torch.cat([rows, model_input.prompt_indices])
        return self.model.compute_logits(hidden[rows])
