"""``deepspeed.moe.layer``."""

from ds_zero._compat.moe import MoE

__all__ = ["MoE"]
