"""GPT-2 on the paged kernels and the tensor-parallel layers (vLLM ``models/gpt2.py``; transformers
``GPT2LMHeadModel`` weights).

Learned position embeddings, pre-LayerNorm blocks, fused ``c_attn`` projection (its loader splits q | k | v and
keeps this rank's heads), tanh-approximated GELU, head tied to the token embedding. transformers stores GPT-2's
projections as ``Conv1D`` (``[in, out]``): ``load_weights`` hands them over transposed into ``nn.Linear`` layout,
lazily, so each rank still reads only its slice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from paged_serve.model_executor.layers.attention import Attention, AttentionMetadata
from paged_serve.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from paged_serve.model_executor.layers.vocab_parallel_embedding import (
    LogitsProcessor,
    ParallelLMHead,
    VocabParallelEmbedding,
)
from paged_serve.model_executor.models.utils import load_weights


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, the tanh approximation (Hendrycks & Gimpel, arXiv:1606.08415), as transformers computes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class TransposedSlice:
    """A ``Conv1D`` weight (``[in, out]``) read as ``[out, in]`` without reading it: indexing reads only the part
    asked for, so a rank still reads only its slice."""

    def __init__(self, lazy):
        self.lazy = lazy

    def get_shape(self) -> list[int]:
        return list(reversed(self.lazy.get_shape()))

    def __getitem__(self, index) -> torch.Tensor:
        index = (index if isinstance(index, tuple) else (index,)) + (slice(None),) * 2
        return self.lazy[index[1::-1]].t()


class GPT2Attention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, total_heads = config["n_embd"], config["n_head"]
        self.head_dim = hidden // total_heads
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
            raise ValueError("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
        scale = self.head_dim**-0.5 if config.get("scale_attn_weights", True) else 1.0
        self.c_attn = QKVParallelLinear(hidden, self.head_dim, total_heads, bias=True)
        self.num_heads = self.c_attn.num_heads
        self.c_proj = RowParallelLinear(hidden, hidden, bias=True)
        self.attn = Attention(self.num_heads, self.head_dim, scale)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        q, k, v = self.c_attn(hidden_states)[0].chunk(3, dim=-1)
        return self.c_proj(self.attn(q, k, v, kv_cache, attn_metadata))[0]


class GPT2MLP(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden = config["n_embd"]
        inner = config.get("n_inner") or 4 * hidden
        if config.get("activation_function", "gelu_new") != "gelu_new":
            raise ValueError(f"activation_function {config.get('activation_function')!r} not supported (gelu_new)")
        self.c_fc = ColumnParallelLinear(hidden, inner, bias=True)
        self.c_proj = RowParallelLinear(inner, hidden, bias=True)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)[0]))[0]


class GPT2Block(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, eps = config["n_embd"], config.get("layer_norm_epsilon", 1e-5)
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = GPT2MLP(config)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        h = hidden_states + self.attn(self.ln_1(hidden_states), kv_cache, attn_metadata)
        return h + self.mlp(self.ln_2(h))


class GPT2LMHeadModel(nn.Module):
    _conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        hidden = config["n_embd"]
        self.wte = VocabParallelEmbedding(config["vocab_size"], hidden)
        self.wpe = nn.Embedding(config.get("n_positions", 1024), hidden)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config["n_layer"]))
        self.ln_f = nn.LayerNorm(hidden, eps=config.get("layer_norm_epsilon", 1e-5))
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", True))
        self.lm_head = ParallelLMHead(config["vocab_size"], hidden)
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(self.wte)
        self.logits_processor = LogitsProcessor(config["vocab_size"])
        self.num_kv_heads, self.head_dim = self.h[0].attn.num_heads, self.h[0].attn.head_dim

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        h = self.wte(input_ids) + self.wpe(positions)
        for block, kv_cache in zip(self.h, kv_caches):
            h = block(h, kv_cache, attn_metadata)
        return self.ln_f(h)

    def get_input_embeddings(self) -> nn.Module:
        return self.wte

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        def transposed():
            for name, tensor in weights:
                if name.endswith((".attn.bias", ".attn.masked_bias")):
                    continue  # causal-mask buffers of older checkpoints
                if name.endswith(self._conv1d):
                    tensor = tensor.t() if isinstance(tensor, torch.Tensor) else TransposedSlice(tensor)
                yield name, tensor

        load_weights(self, transposed(), rename=lambda name: name.removeprefix("transformer."))
