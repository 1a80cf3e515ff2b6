"""``hf_lite.utils`` (transformers' ``utils`` package): the library's logging (``utils.logging``), version checks
(``check_min_version``, ``utils.versions.require_version``), availability checks, and hf-lite's atomic writes."""

from __future__ import annotations

import importlib.util

from . import logging, versions
from .atomic_io import atomic_save_directory, atomic_write_bytes, atomic_write_text
from .versions import MIRRORED_TRANSFORMERS_VERSION, check_min_version


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether ``torch_xla`` is installed; hf-lite never uses it, so scripts take their non-XLA path."""
    return importlib.util.find_spec("torch_xla") is not None


__all__ = [
    "MIRRORED_TRANSFORMERS_VERSION",
    "atomic_save_directory",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_min_version",
    "is_torch_xla_available",
    "logging",
    "versions",
]
