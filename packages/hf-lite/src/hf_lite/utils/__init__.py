"""``hf_lite.utils`` (transformers' ``utils`` package): the library's logging (``utils.logging``), version checks
(``check_min_version``, ``utils.versions.require_version``) and availability checks, all in ``_compat/utils/``; hub
files (``utils.hub``, in ``_infra/hub.py``)."""

from .._compat.utils.import_utils import is_torch_xla_available
from .._compat.utils.versions import MIRRORED_TRANSFORMERS_VERSION, check_min_version
from . import hub, logging, versions

__all__ = ["MIRRORED_TRANSFORMERS_VERSION", "check_min_version", "hub", "is_torch_xla_available", "logging",
           "versions"]
