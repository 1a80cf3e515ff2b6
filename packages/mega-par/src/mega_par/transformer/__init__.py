"""Transformer building blocks over tensor-parallel layers."""

from mega_par.transformer.attention import SelfAttention
from mega_par.transformer.mlp import MLP
from mega_par.transformer.transformer_block import TransformerBlock
from mega_par.transformer.transformer_config import TransformerConfig
from mega_par.transformer.transformer_layer import TransformerLayer

__all__ = ["MLP", "SelfAttention", "TransformerBlock", "TransformerConfig", "TransformerLayer"]
