"""Megatron's data stack, small (``megatron/core/datasets``): indexed token files, GPT samples, blends."""
