"""``hf_lite.models.opt.configuration_opt`` (transformers' path): OPT's config, in ``_compat/models/opt.py``."""

from ..._compat.models.opt import OPTConfig

__all__ = ["OPTConfig"]
