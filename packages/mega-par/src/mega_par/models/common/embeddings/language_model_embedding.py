"""Word (vocab-parallel) + optional learned position embeddings, as ``[s, b, h]``
(``megatron/core/models/common/embeddings/language_model_embedding.py``).

With sequence parallelism the sum is scattered to sequence shards before dropout, which then draws from
the per-TP-rank RNG state.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from mega_par.tensor_parallel.layers import VocabParallelEmbedding
from mega_par.tensor_parallel.mappings import scatter_to_sequence_parallel_region
from mega_par.transformer.module import MegatronModule
from mega_par.transformer.transformer_layer import sequence_parallel_dropout_context


@contextlib.contextmanager
def seeded(seed: int | None):
    """Draw a module's initial weights from its own seed (None: the current default generator)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class LanguageModelEmbedding(MegatronModule):
    def __init__(self, config, vocab_size: int, max_sequence_length: int,
                 position_embedding_type: str = "learned_absolute", num_tokentypes: int = 0,
                 scatter_to_sequence_parallel: bool = True, tp_group=None, seed: int | None = None):
        """``seed`` (mega_par's): the word embedding is drawn under ``seed``, the position embedding under
        ``seed + 1``, so every TP/PP layout holds the same full tables."""
        super().__init__(config=config)
        if num_tokentypes:
            raise ValueError(f"LanguageModelEmbedding: num_tokentypes={num_tokentypes} is not supported")
        if position_embedding_type not in ("learned_absolute", "rope", "none"):
            raise ValueError(f"position_embedding_type must be 'learned_absolute', 'rope' or 'none', "
                             f"got {position_embedding_type!r}")
        self.vocab_size, self.max_sequence_length = vocab_size, max_sequence_length
        self.add_position_embedding = position_embedding_type == "learned_absolute"
        self.scatter_to_sequence_parallel = scatter_to_sequence_parallel
        with seeded(seed):
            self.word_embeddings = VocabParallelEmbedding(vocab_size, config.hidden_size, config=config,
                                                          init_method=config.embedding_init_method)
        self.position_embeddings = None
        if self.add_position_embedding:
            # nn.Embedding's constructor draws a default init (overwritten below); with a seed it draws under
            # fork_rng, so the default generator ends where it would on a stage without the embedding (at PP=2
            # the stages then shuffle their DataLoaders alike: it draws from that generator next)
            with torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext():
                self.position_embeddings = nn.Embedding(max_sequence_length, config.hidden_size,
                                                        dtype=config.params_dtype)
            if config.perform_initialization:
                with seeded(None if seed is None else seed + 1), torch.no_grad():
                    config.embedding_init_method(self.position_embeddings.weight)
            # Replicated over TP but, unlike the norms, NOT marked sequence_parallel (as Megatron): it is added
            # before the scatter to sequence shards, whose backward all-gathers, so every TP rank already holds
            # the whole sequence's gradient; summing it over TP again would double it.
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)

    def zero_parameters(self) -> None:
        """Zero the tables and mark them ``shared`` (Megatron's, for a stage that receives a copy)."""
        for p in self.parameters():
            p.data.fill_(0)
            p.shared = True

    def forward(self, input_ids, position_ids, tokentype_ids=None):
        if tokentype_ids is not None:
            raise ValueError("LanguageModelEmbedding: tokentype_ids are not supported")
        emb = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            emb = emb + self.position_embeddings(position_ids)
        emb = emb.transpose(0, 1).contiguous()
        if self.config.sequence_parallel and self.scatter_to_sequence_parallel:
            emb = scatter_to_sequence_parallel_region(emb)
        with sequence_parallel_dropout_context(self.config):
            return self.embedding_dropout(emb)
