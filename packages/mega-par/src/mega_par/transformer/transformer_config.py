"""``TransformerConfig``: the hyper-parameters a GPT stack is built from (``megatron/core/transformer``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mega_par.tensor_parallel.layers import init_method_normal, scaled_init_method_normal


@dataclass
class TransformerConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int | None = None  # GQA: key/value heads; None = multi-head attention
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    kv_channels: int | None = None  # head dim; default hidden_size // num_attention_heads
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    normalization: str = "LayerNorm"  # or "RMSNorm"
    layernorm_epsilon: float = 1e-5
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    gated_linear_unit: bool = False  # SwiGLU when activation_func is F.silu
    activation_func: Callable = F.gelu
    init_method_std: float = 0.02
    init_method: Callable | None = None
    output_layer_init_method: Callable | None = None
    sequence_parallel: bool = False
    params_dtype: torch.dtype = torch.float32
    recompute_granularity: str | None = None  # "full": checkpoint every layer (RNG-exact recompute)
    # pipeline (Megatron's ModelParallelConfig): free a stage output's data once sent (Megatron's training sets it)
    deallocate_pipeline_outputs: bool = False
    variable_seq_lengths: bool = False  # exchange activation shapes before each p2p message

    def __post_init__(self):
        for name in ("num_layers", "hidden_size", "num_attention_heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {v!r}")
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                             f"num_query_groups ({self.num_query_groups})")
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                                 f"({self.num_attention_heads}) when kv_channels is not given")
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"normalization must be 'LayerNorm' or 'RMSNorm', got {self.normalization!r}")
        if self.recompute_granularity not in (None, "full"):
            raise ValueError(f"recompute_granularity must be None or 'full', got {self.recompute_granularity!r}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.init_method is None:
            self.init_method = init_method_normal(self.init_method_std)
        if self.output_layer_init_method is None:
            self.output_layer_init_method = scaled_init_method_normal(self.init_method_std, self.num_layers)
