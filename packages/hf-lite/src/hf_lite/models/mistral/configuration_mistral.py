"""``hf_lite.models.mistral.configuration_mistral``: Mistral's config, in ``_compat/models/mistral.py``."""

from ..._compat.models.mistral import MistralConfig

__all__ = ["MistralConfig"]
