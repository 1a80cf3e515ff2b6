"""``hf_lite.models.qwen2.configuration_qwen2`` (transformers' path): Qwen2's config, in ``_compat/models/qwen2.py``."""

from ..._compat.models.qwen2 import Qwen2Config

__all__ = ["Qwen2Config"]
