"""Transformer building blocks over tensor-parallel layers."""

from mega_par.transformer.attention import SelfAttention
from mega_par.transformer.mlp import MLP
from mega_par.transformer.module import MegatronModule
from mega_par.transformer.spec_utils import ModuleSpec, build_module
from mega_par.transformer.transformer_block import TransformerBlock
from mega_par.transformer.transformer_config import TransformerConfig
from mega_par.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

__all__ = ["MLP", "MegatronModule", "ModuleSpec", "SelfAttention", "TransformerBlock", "TransformerConfig",
           "TransformerLayer", "TransformerLayerSubmodules", "build_module"]
