"""One pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x)) (``transformer_layer.py``).

With sequence parallelism (arXiv 2205.05198 §4.2.2) the norms and dropouts here run on the rank's
sequence chunk: their parameters are replicated over TP but see different tokens, so their gradients
are marked ``sequence_parallel`` and all-reduced over the TP group after backward.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from mega_par.tensor_parallel.random import get_cuda_rng_tracker
from mega_par.transformer.attention import SelfAttention
from mega_par.transformer.mlp import MLP


def build_norm(config, hidden_size: int | None = None) -> nn.Module:
    size = hidden_size or config.hidden_size
    if config.normalization == "RMSNorm":
        norm = nn.RMSNorm(size, eps=config.layernorm_epsilon, dtype=config.params_dtype)
    else:
        norm = nn.LayerNorm(size, eps=config.layernorm_epsilon, dtype=config.params_dtype)
    for p in norm.parameters():
        p.sequence_parallel = config.sequence_parallel
    return norm


def sequence_parallel_dropout_context(config):
    """With SP each rank holds different tokens, so dropout draws from the per-TP-rank RNG state."""
    return get_cuda_rng_tracker().fork() if config.sequence_parallel else contextlib.nullcontext()


def bias_dropout_add(x: torch.Tensor, bias, residual: torch.Tensor, p: float, training: bool, config) -> torch.Tensor:
    if bias is not None:
        x = x + bias
    if training and p > 0:
        with sequence_parallel_dropout_context(config):
            x = F.dropout(x, p=p, training=True)
    return residual + x


class TransformerLayer(nn.Module):
    def __init__(self, config, layer_number: int):
        super().__init__()
        self.config, self.layer_number = config, layer_number  # 1-based global layer number
        self.input_layernorm = build_norm(config)
        self.self_attention = SelfAttention(config, layer_number)
        self.pre_mlp_layernorm = build_norm(config)
        self.mlp = MLP(config)

    def forward(self, hidden_states: torch.Tensor, rotary_pos_emb: torch.Tensor | None = None) -> torch.Tensor:
        p = self.config.hidden_dropout
        out, bias = self.self_attention(self.input_layernorm(hidden_states), rotary_pos_emb)
        hidden_states = bias_dropout_add(out, bias, hidden_states, p, self.training, self.config)
        out, bias = self.mlp(self.pre_mlp_layernorm(hidden_states))
        return bias_dropout_add(out, bias, hidden_states, p, self.training, self.config)
