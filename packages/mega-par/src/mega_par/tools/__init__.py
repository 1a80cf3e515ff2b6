"""Command-line tools (Megatron-LM's ``tools/``)."""
