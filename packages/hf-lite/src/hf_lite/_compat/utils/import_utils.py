"""Availability checks scripts branch on (transformers' ``utils/import_utils.py``)."""

from __future__ import annotations

import importlib.metadata
import importlib.util


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether ``torch_xla`` is installed; hf-lite never uses it, so scripts take their non-XLA path."""
    return importlib.util.find_spec("torch_xla") is not None


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def is_torch_available() -> bool:
    return _installed("torch")


def is_torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def is_datasets_available() -> bool:
    return _installed("datasets")


def is_tensorboard_available() -> bool:
    return _installed("tensorboard") or _installed("tensorboardX")


def is_accelerate_available(min_version: str | None = None) -> bool:
    """Whether accelerate is installed (hf-lite does not use it; transformers' Trainer does)."""
    if not _installed("accelerate"):
        return False
    if min_version is None:
        return True
    from .versions import _key

    return _key(importlib.metadata.version("accelerate")) >= _key(min_version)


def is_tokenizers_available() -> bool:
    return _installed("tokenizers")


def is_safetensors_available() -> bool:
    return _installed("safetensors")
