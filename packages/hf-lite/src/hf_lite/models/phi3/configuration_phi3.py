"""``hf_lite.models.phi3.configuration_phi3`` (transformers' path): Phi-3's config, in ``_compat/models/phi3.py``."""

from ..._compat.models.phi3 import Phi3Config

__all__ = ["Phi3Config"]
