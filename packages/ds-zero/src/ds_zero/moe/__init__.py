"""``deepspeed.moe`` (:mod:`ds_zero._compat.moe`): the parameter-group helpers; the ``MoE`` layer is refused."""

from ds_zero.moe import layer, utils

__all__ = ["layer", "utils"]
