"""One pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))
(``megatron/core/transformer/transformer_layer.py``), its modules built from ``TransformerLayerSubmodules``.

With sequence parallelism (arXiv 2205.05198 §4.2.2) the norms and dropouts here run on the rank's
sequence chunk: their parameters are replicated over TP but see different tokens, so their gradients
are marked ``sequence_parallel`` and all-reduced over the TP group after backward; the dropouts draw from
the per-TP-rank RNG state.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from mega_par.tensor_parallel.random import get_cuda_rng_tracker
from mega_par.transformer.identity_op import IdentityFuncOp, IdentityOp
from mega_par.transformer.module import GraphableMegatronModule
from mega_par.transformer.spec_utils import build_module


@dataclass
class TransformerLayerSubmodules:
    """Megatron's slots; cross attention (encoder-decoder) has no implementation here and must stay identity."""

    input_layernorm: object = IdentityOp
    self_attention: object = IdentityOp
    self_attn_bda: object = IdentityFuncOp
    pre_cross_attn_layernorm: object = IdentityOp
    cross_attention: object = IdentityOp
    cross_attn_bda: object = IdentityFuncOp
    pre_mlp_layernorm: object = IdentityOp
    mlp: object = IdentityOp
    mlp_bda: object = IdentityFuncOp
    sharded_state_dict_keys_map: dict = field(default_factory=dict)


def sequence_parallel_dropout_context(config):
    """With SP each rank holds different tokens, so dropout draws from the per-TP-rank RNG state."""
    return get_cuda_rng_tracker().fork() if config.sequence_parallel else contextlib.nullcontext()


class TransformerLayer(GraphableMegatronModule):
    def __init__(self, config, submodules: TransformerLayerSubmodules, layer_number: int = 1,
                 hidden_dropout: float | None = None, pg_collection=None, vp_stage: int | None = None):
        super().__init__(config=config, vp_stage=vp_stage)
        if not isinstance(submodules, TransformerLayerSubmodules):
            raise TypeError(f"TransformerLayer needs TransformerLayerSubmodules, got {type(submodules).__name__}")
        for name in ("pre_cross_attn_layernorm", "cross_attention", "cross_attn_bda"):
            if getattr(submodules, name) not in (IdentityOp, IdentityFuncOp):
                raise ValueError(f"TransformerLayer: {name} is not supported by mega_par (decoder-only layers)")
        self.submodules_config = submodules
        self.layer_number = layer_number  # 1-based global layer number
        self.hidden_dropout = config.hidden_dropout if hidden_dropout is None else hidden_dropout
        norm_kw = dict(config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)
        self.input_layernorm = build_module(submodules.input_layernorm, **norm_kw)
        self.self_attention = build_module(submodules.self_attention, config=config, layer_number=layer_number)
        self.self_attn_bda = build_module(submodules.self_attn_bda)
        self.pre_mlp_layernorm = build_module(submodules.pre_mlp_layernorm, **norm_kw)
        self.mlp = build_module(submodules.mlp, config=config)
        self.mlp_bda = build_module(submodules.mlp_bda)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, context=None,
                context_mask=None, rotary_pos_emb: torch.Tensor | None = None, **kwargs):
        """Returns ``(hidden_states, context)`` as Megatron's layer does."""
        if context is not None or context_mask is not None:
            raise ValueError("TransformerLayer: context (cross attention) is not supported by mega_par")
        unknown = sorted(k for k, v in kwargs.items() if v is not None)
        if unknown:
            raise ValueError(f"TransformerLayer.forward: unsupported arguments {unknown}")
        out_with_bias = self.self_attention(self.input_layernorm(hidden_states), attention_mask=attention_mask,
                                            rotary_pos_emb=rotary_pos_emb)
        with sequence_parallel_dropout_context(self.config):
            hidden_states = self.self_attn_bda(self.training, self.config.bias_dropout_fusion)(
                out_with_bias, hidden_states, self.hidden_dropout)
        out_with_bias = self.mlp(self.pre_mlp_layernorm(hidden_states))
        with sequence_parallel_dropout_context(self.config):
            hidden_states = self.mlp_bda(self.training, self.config.bias_dropout_fusion)(
                out_with_bias, hidden_states, self.hidden_dropout)
        return hidden_states, context
