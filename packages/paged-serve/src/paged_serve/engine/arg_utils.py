"""vLLM's ``engine/arg_utils.py`` path: ``EngineArgs`` lives in ``paged_serve._compat.arg_utils``."""

from paged_serve._compat.arg_utils import EngineArgs

__all__ = ["EngineArgs"]
