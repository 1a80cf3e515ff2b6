"""``hf_lite.models.gemma.configuration_gemma`` (transformers' path): Gemma's config, in ``_compat/models/gemma.py``."""

from ..._compat.models.gemma import GemmaConfig

__all__ = ["GemmaConfig"]
