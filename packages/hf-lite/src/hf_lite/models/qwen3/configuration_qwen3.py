"""``hf_lite.models.qwen3.configuration_qwen3`` (transformers' path): Qwen3's config, in ``_compat/models/qwen3.py``."""

from ..._compat.models.qwen3 import Qwen3Config

__all__ = ["Qwen3Config"]
