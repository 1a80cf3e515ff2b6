"""Tokenizers for Megatron's datasets (``megatron/core/tokenizers``)."""
