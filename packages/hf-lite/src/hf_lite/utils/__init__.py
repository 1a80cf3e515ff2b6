"""``hf_lite.utils`` (transformers' ``utils`` package): the library's logging (``utils.logging``), version checks
(``check_min_version``, ``utils.versions.require_version``) and availability checks, all in ``_compat/utils/``; hub
files (``utils.hub``, in ``_infra/hub.py``)."""

from .._compat.utils.import_utils import (
    is_accelerate_available,
    is_datasets_available,
    is_safetensors_available,
    is_tokenizers_available,
    is_torch_available,
    is_torch_cuda_available,
    is_torch_xla_available,
)
from .._compat.utils.versions import MIRRORED_TRANSFORMERS_VERSION, check_min_version
from . import hub, logging, versions
from .hub import PushToHubMixin, cached_file

__all__ = ["MIRRORED_TRANSFORMERS_VERSION", "PushToHubMixin", "cached_file", "check_min_version", "hub",
           "is_accelerate_available", "is_datasets_available", "is_safetensors_available", "is_tokenizers_available",
           "is_torch_available", "is_torch_cuda_available", "is_torch_xla_available", "logging", "versions"]
