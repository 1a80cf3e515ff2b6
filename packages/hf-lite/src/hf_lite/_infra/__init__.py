"""hf-lite's infrastructure: the hardening the core calls at one point (atomic writes and directory swaps, validated
safetensors headers). Imports neither the core nor ``_compat``."""
