"""``torch.distributed.fsdp.wrap``: ``ModuleWrapPolicy`` and the wrapping itself (``pt_dist/fsdp/_wrap_utils.py``),
torch's other policies and manual wrapping (``pt_dist/_compat/fsdp/wrap.py``)."""

from pt_dist._compat.fsdp.wrap import (
    CustomPolicy,
    enable_wrap,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
    wrap,
)
from pt_dist.fsdp._wrap_utils import ModuleWrapPolicy, _recursive_wrap, always_wrap_policy

__all__ = ["CustomPolicy", "ModuleWrapPolicy", "always_wrap_policy", "enable_wrap", "lambda_auto_wrap_policy",
           "size_based_auto_wrap_policy", "transformer_auto_wrap_policy", "wrap"]
_ = (_recursive_wrap,)  # importable from here, as before
