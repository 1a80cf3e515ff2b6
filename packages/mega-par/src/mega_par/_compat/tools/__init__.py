"""Megatron-LM's command-line tools (``tools/``)."""
