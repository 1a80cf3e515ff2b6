"""``hf_lite.utils.versions`` (transformers' ``utils/versions.py``): in ``_compat/utils/versions.py``."""

from .._compat.utils.versions import MIRRORED_TRANSFORMERS_VERSION, check_min_version, require_version

__all__ = ["MIRRORED_TRANSFORMERS_VERSION", "check_min_version", "require_version"]
