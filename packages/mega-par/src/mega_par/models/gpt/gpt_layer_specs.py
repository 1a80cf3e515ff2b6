"""Layer specs for GPT: which module fills each slot of a ``TransformerLayer``
(``megatron/core/models/gpt/gpt_layer_specs.py``).

``get_gpt_layer_local_spec`` is Megatron's spec built only from Megatron-core's own modules (no Transformer
Engine): torch norms, ``ColumnParallelLinear`` / ``RowParallelLinear``, ``DotProductAttention`` with a causal
``attn_mask_type``, and the bias-dropout-add epilogue. The options mega_par has no module for are refused.
"""

from __future__ import annotations

from mega_par.fusions.fused_bias_dropout import get_bias_dropout_add
from mega_par.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from mega_par.transformer.attention import SelfAttention, SelfAttentionSubmodules
from mega_par.transformer.dot_product_attention import DotProductAttention
from mega_par.transformer.enums import AttnMaskType
from mega_par.transformer.identity_op import IdentityOp
from mega_par.transformer.mlp import MLP, MLPSubmodules
from mega_par.transformer.spec_utils import ModuleSpec
from mega_par.transformer.torch_norm import WrappedTorchNorm
from mega_par.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules


def get_mlp_module_spec(use_te: bool | None = True, num_experts: int | None = None,
                        moe_grouped_gemm: bool | None = False, fp8: str | None = None) -> ModuleSpec:
    """The dense MLP spec (``use_te=False``: the local linears)."""
    if use_te:
        raise ValueError("get_mlp_module_spec: use_te=True needs Transformer Engine, which mega_par does not have; "
                         "pass use_te=False")
    if num_experts is not None:
        raise ValueError(f"get_mlp_module_spec: num_experts={num_experts!r} (mixture of experts) is not supported")
    return ModuleSpec(module=MLP, submodules=MLPSubmodules(linear_fc1=ColumnParallelLinear,
                                                           linear_fc2=RowParallelLinear))


def get_gpt_layer_local_submodules(num_experts: int | None = None, moe_grouped_gemm: bool | None = False,
                                   qk_layernorm: bool | None = False, multi_latent_attention: bool | None = False,
                                   fp8: str | None = None, normalization: str | None = None,
                                   qk_l2_norm: bool | None = False) -> TransformerLayerSubmodules:
    """The submodules of Megatron's local GPT layer. The norm class reads ``config.normalization`` when
    built (LayerNorm or RMSNorm), as Megatron's ``WrappedTorchNorm`` does, so ``normalization`` selects
    nothing more here."""
    for name, value, default in (("num_experts", num_experts, None), ("moe_grouped_gemm", moe_grouped_gemm, False),
                                 ("multi_latent_attention", multi_latent_attention, False),
                                 ("qk_l2_norm", qk_l2_norm, False), ("fp8", fp8, None)):
        if value != default:
            raise ValueError(f"get_gpt_layer_local_spec: {name}={value!r} is not supported by mega_par")
    if normalization not in (None, "LayerNorm", "RMSNorm"):
        raise ValueError(f"get_gpt_layer_local_spec: normalization must be None, 'LayerNorm' or 'RMSNorm', "
                         f"got {normalization!r}")
    return TransformerLayerSubmodules(
        input_layernorm=WrappedTorchNorm,
        self_attention=ModuleSpec(
            module=SelfAttention,
            params={"attn_mask_type": AttnMaskType.causal},
            submodules=SelfAttentionSubmodules(
                linear_qkv=ColumnParallelLinear,
                core_attention=DotProductAttention,
                linear_proj=RowParallelLinear,
                q_layernorm=WrappedTorchNorm if qk_layernorm else IdentityOp,
                k_layernorm=WrappedTorchNorm if qk_layernorm else IdentityOp,
            ),
        ),
        self_attn_bda=get_bias_dropout_add,
        pre_mlp_layernorm=WrappedTorchNorm,
        mlp=get_mlp_module_spec(use_te=False),
        mlp_bda=get_bias_dropout_add,
        sharded_state_dict_keys_map={"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                                     "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"},
    )


def get_gpt_layer_local_spec(num_experts: int | None = None, moe_grouped_gemm: bool | None = False,
                             qk_layernorm: bool | None = False, multi_latent_attention: bool | None = False,
                             fp8: str | None = None, normalization: str | None = None,
                             qk_l2_norm: bool | None = False) -> ModuleSpec:
    """Megatron's ``get_gpt_layer_local_spec``: a ``TransformerLayer`` spec from local modules."""
    return ModuleSpec(module=TransformerLayer, submodules=get_gpt_layer_local_submodules(
        num_experts, moe_grouped_gemm, qk_layernorm, multi_latent_attention, fp8, normalization, qk_l2_norm))
