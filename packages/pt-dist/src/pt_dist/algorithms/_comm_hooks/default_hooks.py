"""``torch.distributed.algorithms._comm_hooks.default_hooks`` (``pt_dist/_compat/fsdp/comm_hooks.py``)."""

from pt_dist._compat.fsdp.comm_hooks import (
    DefaultState,
    LowPrecisionState,
    allreduce_hook,
    bf16_compress_hook,
    fp16_compress_hook,
    reduce_scatter_hook,
)

__all__ = ["DefaultState", "LowPrecisionState", "allreduce_hook", "bf16_compress_hook", "fp16_compress_hook",
           "reduce_scatter_hook"]
