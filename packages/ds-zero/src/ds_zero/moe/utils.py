"""``deepspeed.moe.utils``."""

from ds_zero._compat.moe import (
                                 is_moe_param,
                                 is_moe_param_group,
                                 split_params_into_different_moe_groups_for_optimizer,
                                 split_params_into_shared_and_expert_params,
)

__all__ = ["is_moe_param", "is_moe_param_group", "split_params_into_different_moe_groups_for_optimizer",
           "split_params_into_shared_and_expert_params"]
