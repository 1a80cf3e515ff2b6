"""GPT-2 on the paged kernels (vLLM ``models/gpt2.py``; transformers ``GPT2LMHeadModel`` weights).

Learned position embeddings, pre-LayerNorm blocks, fused ``c_attn`` projection, tanh-approximated GELU, head tied
to the token embedding. transformers stores GPT-2's projections as ``Conv1D`` (``[in, out]``): ``load_weights``
transposes them into ``nn.Linear`` layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from paged_serve.model_executor.layers.attention import Attention, AttentionMetadata
from paged_serve.model_executor.models.utils import check_loaded
from torch import nn


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, the tanh approximation (Hendrycks & Gimpel, arXiv:1606.08415), as transformers computes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, self.num_heads = config["n_embd"], config["n_head"]
        self.head_dim = hidden // self.num_heads
        if config.get("scale_attn_by_inverse_layer_idx") or config.get("reorder_and_upcast_attn"):
            raise ValueError("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
        scale = self.head_dim**-0.5 if config.get("scale_attn_weights", True) else 1.0
        self.c_attn = nn.Linear(hidden, 3 * hidden)
        self.c_proj = nn.Linear(hidden, hidden)
        self.attn = Attention(self.num_heads, self.head_dim, scale)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        q, k, v = self.c_attn(hidden_states).chunk(3, dim=-1)
        return self.c_proj(self.attn(q, k, v, kv_cache, attn_metadata))


class GPT2Block(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, eps = config["n_embd"], config.get("layer_norm_epsilon", 1e-5)
        inner = config.get("n_inner") or 4 * hidden
        if config.get("activation_function", "gelu_new") != "gelu_new":
            raise ValueError(f"activation_function {config.get('activation_function')!r} not supported (gelu_new)")
        self.ln_1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(hidden, eps=eps)
        self.c_fc = nn.Linear(hidden, inner)
        self.c_proj = nn.Linear(inner, hidden)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        h = hidden_states + self.attn(self.ln_1(hidden_states), kv_cache, attn_metadata)
        return h + self.c_proj(gelu_new(self.c_fc(self.ln_2(h))))


class GPT2LMHeadModel(nn.Module):
    _conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        hidden = config["n_embd"]
        self.wte = nn.Embedding(config["vocab_size"], hidden)
        self.wpe = nn.Embedding(config.get("n_positions", 1024), hidden)
        self.h = nn.ModuleList(GPT2Block(config) for _ in range(config["n_layer"]))
        self.ln_f = nn.LayerNorm(hidden, eps=config.get("layer_norm_epsilon", 1e-5))
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", True))
        self.lm_head = nn.Linear(hidden, config["vocab_size"], bias=False)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight
        self.num_kv_heads, self.head_dim = config["n_head"], hidden // config["n_head"]

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        h = self.wte(input_ids) + self.wpe(positions)
        for block, kv_cache in zip(self.h, kv_caches):
            h = block(h, kv_cache, attn_metadata)
        return self.ln_f(h)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name.endswith((".attn.bias", ".attn.masked_bias")) and name not in params:
                continue  # causal-mask buffers of older checkpoints
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            key = name.removeprefix("transformer.")
            key = key.replace(".mlp.c_fc.", ".c_fc.").replace(".mlp.c_proj.", ".c_proj.")
            if key not in params:
                raise ValueError(f"unexpected tensor {name!r} in the checkpoint")
            if any(name.endswith(c) for c in self._conv1d):
                tensor = tensor.t()
            if params[key].shape != tensor.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != expected {tuple(params[key].shape)}")
            params[key].data.copy_(tensor)
            loaded.add(key)
        expected = set(params)
        if self.tie_word_embeddings:
            expected.discard("lm_head.weight")
        check_loaded(expected, loaded)
