"""Tokenizers for Megatron's datasets (``megatron/core/tokenizers``)."""

from mega_par.tokenizers.megatron_tokenizer import MegatronTokenizer

__all__ = ["MegatronTokenizer"]
