"""``deepspeed.checkpoint.utils``."""

from ds_zero._compat.checkpoint import (
    MODEL_FILE_PREFIX,
    MODEL_FILE_SUFFIX,
    OPTIM_FILE_SUFFIX,
    ZERO_FILE_PREFIX,
    clone_tensors_for_torch_save,
    get_layer_ckpt_name_for_rank,
    get_model_ckpt_name_for_rank,
    get_zero_ckpt_name_for_rank,
)

__all__ = ["MODEL_FILE_PREFIX", "MODEL_FILE_SUFFIX", "OPTIM_FILE_SUFFIX", "ZERO_FILE_PREFIX",
           "clone_tensors_for_torch_save", "get_layer_ckpt_name_for_rank", "get_model_ckpt_name_for_rank",
           "get_zero_ckpt_name_for_rank"]
