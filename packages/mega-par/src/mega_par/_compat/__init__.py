"""Compatibility: what exists only so Megatron's own scripts and tests run unchanged (its data pipeline,
tokenizers and tools). It imports the core; the core never imports it."""
