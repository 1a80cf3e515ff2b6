"""Availability checks scripts branch on (transformers' ``utils/import_utils.py``)."""

from __future__ import annotations

import importlib.util


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether ``torch_xla`` is installed; hf-lite never uses it, so scripts take their non-XLA path."""
    return importlib.util.find_spec("torch_xla") is not None
