"""``torch.distributed.algorithms._comm_hooks``: FSDP1's communication hooks (``default_hooks``)."""

from pt_dist._compat.fsdp.comm_hooks import DefaultState, LowPrecisionState

__all__ = ["DefaultState", "LowPrecisionState"]
