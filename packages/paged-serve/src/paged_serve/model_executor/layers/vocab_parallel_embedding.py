"""The vocabulary split over the ranks (vLLM ``vocab_parallel_embedding.py`` and ``logits_processor.py``).

The vocabulary is padded to a multiple of 64 and cut into one contiguous range per rank. ``VocabParallelEmbedding``
looks up the ids in its range, zeros the others and all-reduces, so every rank gets every row (Megatron-LM
arXiv:1909.08053 §3, the input embedding). ``ParallelLMHead`` holds the same rows of the output projection: each
rank scores its range, ``LogitsProcessor`` gathers the pieces on the driver (rank 0, where the sampler runs) and
drops the padding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paged_serve.distributed.parallel_state import get_tp_group
from paged_serve.model_executor.layers.linear import divide, narrow

DEFAULT_VOCAB_PADDING_SIZE = 64


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype: torch.dtype | None = None,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):  # fmt: skip
        super().__init__()
        self.tp_group = get_tp_group()
        self.tp_rank, self.tp_size = self.tp_group.rank, self.tp_group.world_size
        self.org_vocab_size, self.embedding_dim = num_embeddings, embedding_dim
        pad_to = padding_size * self.tp_size  # every rank the same number of rows
        self.num_embeddings_padded = -(-num_embeddings // pad_to) * pad_to
        self.num_embeddings_per_partition = divide(self.num_embeddings_padded, self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = min(self.vocab_start_index + self.num_embeddings_per_partition, num_embeddings)
        shape = (self.num_embeddings_per_partition, embedding_dim)
        self.weight = nn.Parameter(torch.empty(shape, dtype=params_dtype or torch.get_default_dtype()))

    def weight_loader(self, param: nn.Parameter, loaded_weight) -> None:
        """This rank's rows of the ``[vocab, hidden]`` checkpoint tensor; the padding rows are zero."""
        rows = max(self.vocab_end_index - self.vocab_start_index, 0)
        param.data.zero_()
        if rows:
            param.data[:rows].copy_(narrow(loaded_weight, 0, self.vocab_start_index, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local = (input_ids - self.vocab_start_index).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside[:, None], 0)
        return self.tp_group.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, split by vocabulary rows like the embedding (and tied to it when the model ties)."""

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_):
        raise RuntimeError("LMHead's weights are used through LogitsProcessor, not called")


class LogitsProcessor(nn.Module):
    """Hidden states -> logits over the vocabulary, whole on the driver only (``None`` on the other ranks)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp_group = get_tp_group()

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self.tp_group.gather(F.linear(hidden_states, lm_head.weight))
        return None if logits is None else logits[..., : self.vocab_size]
