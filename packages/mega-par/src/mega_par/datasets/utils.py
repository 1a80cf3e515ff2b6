"""Upstream's ``megatron.core.datasets.utils``, kept so Megatron's scripts run;
the code is ``mega_par._compat.datasets.utils``."""

from mega_par._compat.datasets.utils import compile_helpers

__all__ = ["compile_helpers"]
