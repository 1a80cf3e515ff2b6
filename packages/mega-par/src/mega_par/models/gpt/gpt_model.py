"""``GPTModel``: embedding -> transformer block -> vocab-parallel output layer (``megatron/core/models/gpt``).

``pre_process`` (first stage) owns the embedding, ``post_process`` (last stage) the final norm, output layer
and loss; middle stages receive activations via ``set_input_tensor``. With tied embeddings and several
stages the last stage holds its own copy of the word embeddings, initialised identically; the pipeline's
embedding group all-reduces the two copies' gradients (``finalize_model_grads``) so they stay equal.

Activations flow as ``[sequence, batch, hidden]`` (sequence-sharded with SP); parameter initialisation is
seeded per module (embedding, each layer, output layer) so any TP/PP layout holds the same full model.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from mega_par import parallel_state as ps
from mega_par.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from mega_par.tensor_parallel.layers import ColumnParallelLinear, VocabParallelEmbedding
from mega_par.tensor_parallel.mappings import (
    gather_from_tensor_model_parallel_region,
    scatter_to_sequence_parallel_region,
)
from mega_par.transformer.attention import RotaryEmbedding
from mega_par.transformer.transformer_block import TransformerBlock
from mega_par.transformer.transformer_layer import sequence_parallel_dropout_context


@contextlib.contextmanager
def _seeded(seed: int):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class LanguageModelEmbedding(nn.Module):
    """Word (vocab-parallel) + optional learned position embeddings, as ``[s, b, h]``."""

    def __init__(self, config, vocab_size: int, max_sequence_length: int, position_embedding_type: str, seed: int):
        super().__init__()
        self.config = config
        with _seeded(seed):
            self.word_embeddings = VocabParallelEmbedding(vocab_size, config.hidden_size, config=config,
                                                          init_method=config.init_method)
        self.position_embeddings = None
        if position_embedding_type == "learned_absolute":
            self.position_embeddings = nn.Embedding(max_sequence_length, config.hidden_size,
                                                    dtype=config.params_dtype)
            with _seeded(seed + 1), torch.no_grad():
                config.init_method(self.position_embeddings.weight)
            # Replicated over TP but, unlike the norms, NOT marked sequence_parallel (as Megatron): it is added
            # before the scatter to sequence shards, whose backward all-gathers, so every TP rank already holds
            # the whole sequence's gradient; summing it over TP again would double it.
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, input_ids, position_ids):
        emb = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            emb = emb + self.position_embeddings(position_ids)
        emb = emb.transpose(0, 1).contiguous()
        if self.config.sequence_parallel:
            emb = scatter_to_sequence_parallel_region(emb)
        with sequence_parallel_dropout_context(self.config):
            return self.dropout(emb)


class GPTModel(nn.Module):
    def __init__(self, config, vocab_size: int, max_sequence_length: int, pre_process: bool = True,
                 post_process: bool = True, parallel_output: bool = True,
                 share_embeddings_and_output_weights: bool = False, position_embedding_type: str = "learned_absolute",
                 rotary_base: float = 10000.0, seed: int | None = None):
        super().__init__()
        if position_embedding_type not in ("learned_absolute", "rope"):
            raise ValueError(f"position_embedding_type must be 'learned_absolute' or 'rope', "
                             f"got {position_embedding_type!r}")
        if ps.get_context_parallel_world_size() != 1:
            raise ValueError("GPTModel supports context_parallel_size=1 only "
                             f"(got {ps.get_context_parallel_world_size()})")
        if vocab_size % ps.get_tensor_model_parallel_world_size():
            raise ValueError(f"vocab_size ({vocab_size}) must be divisible by the tensor-parallel size "
                             f"({ps.get_tensor_model_parallel_world_size()}); pad the vocabulary")
        self.config, self.vocab_size, self.max_sequence_length = config, vocab_size, max_sequence_length
        self.pre_process, self.post_process, self.parallel_output = pre_process, post_process, parallel_output
        self.share_embeddings_and_output_weights = share_embeddings_and_output_weights
        self.position_embedding_type = position_embedding_type
        if seed is None:  # one draw from the (TP/PP-identical) default generator fixes every module's seed
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        self.seed = seed
        emb_seed, out_seed = seed, seed + 2 * config.num_layers + 7
        if pre_process:
            self.embedding = LanguageModelEmbedding(config, vocab_size, max_sequence_length,
                                                    position_embedding_type, emb_seed)
        self.rotary_pos_emb = RotaryEmbedding(config.kv_channels, rotary_base) \
            if position_embedding_type == "rope" else None
        self.decoder = TransformerBlock(config, post_process=post_process, layer_seed=seed + 10)
        if post_process:
            tied_here = share_embeddings_and_output_weights and pre_process
            with _seeded(emb_seed if share_embeddings_and_output_weights else out_seed):
                self.output_layer = ColumnParallelLinear(config.hidden_size, vocab_size, config=config,
                                                         init_method=config.init_method, bias=False,
                                                         gather_output=False, skip_weight_param_allocation=tied_here)
            if share_embeddings_and_output_weights and not pre_process:
                self.output_layer.weight.shared_embedding = True
        if share_embeddings_and_output_weights and pre_process:
            self.embedding.word_embeddings.weight.shared_embedding = True

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, (list, tuple)):
            input_tensor = input_tensor[0]
        self.decoder.set_input_tensor(input_tensor)

    def shared_embedding_or_output_weight(self):
        if self.pre_process:
            return self.embedding.word_embeddings.weight
        if self.post_process:
            return self.output_layer.weight
        return None

    def forward(self, input_ids, position_ids=None, attention_mask=None, labels=None):
        """Returns the hidden state ``[s, b, h]`` on non-last stages; on the last stage the per-token
        loss ``[b, s]`` when ``labels`` is given, else logits ``[b, s, vocab/tp]`` (full vocab if
        ``parallel_output=False``). Attention is causal; ``attention_mask`` other than None is rejected."""
        if attention_mask is not None:
            raise ValueError("GPTModel uses causal attention; pass attention_mask=None")
        if self.pre_process:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            hidden = self.embedding(input_ids, position_ids)
        else:
            hidden = None
        rotary = None
        if self.rotary_pos_emb is not None:
            seq = input_ids.shape[1] if input_ids is not None else self._full_seq_len()
            rotary = self.rotary_pos_emb(seq)
        hidden = self.decoder(hidden, rotary)
        if not self.post_process:
            return hidden
        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        logits, _ = self.output_layer(hidden, weight=weight)  # [s, b, V/tp]
        if labels is None:
            if not self.parallel_output:
                logits = gather_from_tensor_model_parallel_region(logits)
            return logits.transpose(0, 1).contiguous()
        loss = vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous())
        return loss.transpose(0, 1).contiguous()

    def _full_seq_len(self) -> int:
        s = self.decoder.input_tensor.shape[0]
        return s * ps.get_tensor_model_parallel_world_size() if self.config.sequence_parallel else s
