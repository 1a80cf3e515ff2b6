"""``TransformerConfig``: the hyper-parameters a GPT stack is built from
(``megatron/core/transformer/transformer_config.py``), on top of ``ModelParallelConfig``.

Field names and defaults are Megatron's. Those mega_par implements change the model; the kernel-fusion
flags (``bias_activation_fusion``, ``bias_dropout_fusion``, ``masked_softmax_fusion``, ``apply_rope_fusion``)
select faster kernels for the same math there and are accepted here with the same result; the rest of the
fields Megatron's own tests set are accepted only at Megatron's default (another value: ValueError naming it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F

from mega_par.model_parallel_config import ModelParallelConfig, refuse_unimplemented
from mega_par.tensor_parallel.layers import init_method_normal, scaled_init_method_normal
from mega_par.transformer.enums import AttnBackend

_TRANSFORMER_NOT_IMPLEMENTED = {
    "mtp_num_layers": None, "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
    "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
    "fp32_residual_connection": False, "apply_residual_connection_post_layernorm": False,
    "layernorm_zero_centered_gamma": False, "num_moe_experts": None, "moe_router_topk": 2,
    "moe_ffn_hidden_size": None, "rotary_interleaved": False, "window_size": None,
    "calculate_per_token_loss": False, "multi_latent_attention": False, "apply_query_key_layer_scaling": False,
    "attention_softmax_in_fp32": True, "persist_layer_norm": False, "memory_efficient_layer_norm": False,
    "distribute_saved_activations": False, "fp8": None,
}


@dataclass
class TransformerConfig(ModelParallelConfig):
    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    mtp_num_layers: int | None = None
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    attention_backend: AttnBackend = AttnBackend.auto
    softmax_scale: float | None = None  # None: 1 / sqrt(kv_channels)
    num_query_groups: int | None = None  # GQA: key/value heads; None = multi-head attention
    ffn_hidden_size: int | None = None  # default 4 * hidden_size
    kv_channels: int | None = None  # head dim; default hidden_size // num_attention_heads
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    fp32_residual_connection: bool = False
    apply_residual_connection_post_layernorm: bool = False
    layernorm_epsilon: float = 1e-5
    layernorm_zero_centered_gamma: bool = False
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    gated_linear_unit: bool = False  # SwiGLU when activation_func is F.silu
    activation_func: Callable = F.gelu
    num_moe_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    rotary_interleaved: bool = False
    window_size: tuple | None = None
    normalization: str = "LayerNorm"  # or "RMSNorm"
    qk_layernorm: bool = False  # read by Megatron's block-spec helpers; the local layer spec takes its own flag
    test_mode: bool = False
    calculate_per_token_loss: bool = False
    multi_latent_attention: bool = False
    init_method: Callable | None = None
    output_layer_init_method: Callable | None = None
    init_method_std: float = 0.02
    embedding_init_method: Callable | None = None
    embedding_init_method_std: float | None = None
    apply_query_key_layer_scaling: bool = False
    attention_softmax_in_fp32: bool = True
    bias_activation_fusion: bool = False
    masked_softmax_fusion: bool = False
    persist_layer_norm: bool = False
    memory_efficient_layer_norm: bool = False
    bias_dropout_fusion: bool = False
    apply_rope_fusion: bool = False
    recompute_granularity: str | None = None  # "full": checkpoint layers (RNG-exact recompute)
    recompute_method: str | None = None  # "uniform": every recompute_num_layers; "block": the first N per stage
    recompute_num_layers: int | None = None
    distribute_saved_activations: bool | None = False
    fp8: str | None = None

    def __post_init__(self):
        super().__post_init__()
        refuse_unimplemented(self, _TRANSFORMER_NOT_IMPLEMENTED)
        for name in ("num_layers", "hidden_size", "num_attention_heads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {v!r}")
        if self.num_attention_heads % self.tensor_model_parallel_size:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"tensor_model_parallel_size ({self.tensor_model_parallel_size}).")
        if self.num_query_groups is None:
            self.num_query_groups = self.num_attention_heads
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                             f"num_query_groups ({self.num_query_groups})")
        if self.num_query_groups % self.tensor_model_parallel_size:
            raise ValueError(f"num_query_groups ({self.num_query_groups}) must be a multiple of "
                             f"tensor_model_parallel_size ({self.tensor_model_parallel_size}).")
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                                 f"({self.num_attention_heads}) when kv_channels is not given")
            self.kv_channels = self.hidden_size // self.num_attention_heads
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.normalization not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"normalization must be 'LayerNorm' or 'RMSNorm', got {self.normalization!r}")
        if self.attention_backend not in (AttnBackend.auto, AttnBackend.local, AttnBackend.unfused):
            raise ValueError(f"attention_backend={self.attention_backend!r} is not implemented in mega_par "
                             "(the unfused local path: AttnBackend.auto, .local or .unfused)")
        self._check_recompute()
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.init_method is None:
            self.init_method = init_method_normal(self.init_method_std)
        if self.output_layer_init_method is None:
            self.output_layer_init_method = scaled_init_method_normal(self.init_method_std, self.num_layers)
        if self.embedding_init_method_std is None:
            self.embedding_init_method_std = self.init_method_std
        if self.embedding_init_method is None:
            self.embedding_init_method = self.init_method if self.embedding_init_method_std == self.init_method_std \
                else init_method_normal(self.embedding_init_method_std)

    def _check_recompute(self) -> None:
        """Megatron's rules: "full" needs a method ("uniform" / "block") and a layer count; "selective"
        (recomputing only attention's core) has no implementation here."""
        g = self.recompute_granularity
        if g is None:
            return
        if g != "full":
            raise ValueError(f"recompute_granularity must be None or 'full' in mega_par, got {g!r}")
        if self.recompute_method not in ("uniform", "block"):
            raise ValueError(f'Using recompute_granularity: full so recompute_method must be "block" or "uniform", '
                             f"got {self.recompute_method!r}")
        per_stage = self.num_layers // self.pipeline_model_parallel_size
        n = self.recompute_num_layers
        if not isinstance(n, int) or not 1 <= n <= per_stage:
            raise ValueError(f"When using recompute_granularity: full recompute_num_layers must be between 1 and "
                             f"num_layers_per_pipeline_rank: {per_stage}, got {n!r}")
