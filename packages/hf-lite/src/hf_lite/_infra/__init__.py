"""hf-lite's infrastructure: the hardening the core calls at one point (atomic writes and directory swaps, validated
safetensors headers, hub names resolved and pushed through ``huggingface_hub`` in ``hub.py``). Imports neither the
core nor ``_compat``."""
