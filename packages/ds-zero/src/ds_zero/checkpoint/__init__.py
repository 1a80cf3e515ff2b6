"""DeepSpeed-layout checkpoints (``engine.save_checkpoint`` / ``load_checkpoint``); they live in
:mod:`ds_zero._compat.checkpoint`."""

from ds_zero._compat.checkpoint import (
    LATEST,
    MODEL_FILE,
    load_checkpoint,
    model_file,
    optim_file,
    resolve_tag_dir,
    save_checkpoint,
)
from ds_zero.checkpoint import utils

__all__ = ["LATEST", "MODEL_FILE", "load_checkpoint", "model_file", "optim_file", "resolve_tag_dir",
           "save_checkpoint", "utils"]
