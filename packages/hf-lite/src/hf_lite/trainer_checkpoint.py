"""What a Trainer checkpoint holds beside the model (transformers' ``trainer.py`` ``_save_optimizer_and_scheduler``,
``_save_rng_state`` and the ``_load_*`` of resuming): the optimizer (one file per rank when the plugin shards it), the
scheduler, the grad scaler, each rank's RNG states and trainer_state.json, written into a checkpoint directory and
read back. ``Trainer._save_checkpoint`` (``trainer_loop.py``) assembles the directory and calls these."""

from __future__ import annotations

import logging
import os

import torch

from ._infra.atomic_io import torch_save_synced
from ._infra.rng_state import get_rng_states, set_rng_states
from .checkpoint_utils import resolve_weight_files
from .core_model_loading import load_checkpoint
from .modeling_utils import PreTrainedModel
from .trainer_events import TrainerState
from .trainer_utils import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME

logger = logging.getLogger(__name__)


def save_training_state(output_dir: str, args, plugin, optimizer, lr_scheduler, scaler) -> None:
    """Optimizer (one file per rank when the plugin shards it), scheduler, grad scaler and this rank's RNG states."""
    sharded = plugin.sharded_optimizer_state
    if sharded or args.should_save:
        path = os.path.join(output_dir, optimizer_file(args, sharded))
        torch_save_synced(plugin.optimizer_state_dict(optimizer), path)
    if args.should_save:
        torch_save_synced(lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
        if scaler is not None:
            torch_save_synced(scaler.state_dict(), os.path.join(output_dir, SCALER_NAME))
    torch_save_synced(get_rng_states(), os.path.join(output_dir, rng_file(args)))


def load_model_weights(model, checkpoint: str) -> None:
    """The checkpoint's weights into ``model`` (every rank reads them, before wrapping); all must fit."""
    files = resolve_weight_files(checkpoint)
    if isinstance(model, PreTrainedModel):
        info = load_checkpoint(model, files, ignore_mismatched_sizes=False)
        model.tie_weights()
        bad = {k: v for k, v in info.items() if k != "error_msgs" and v}
        if bad:
            raise ValueError(f"checkpoint {checkpoint!r} does not fit {type(model).__name__}: {bad}")
    else:
        from safetensors.torch import load_file

        model.load_state_dict({k: v for file in files for k, v in load_file(file).items()})


def load_optimizer_and_scheduler(checkpoint: str, args, plugin, optimizer, lr_scheduler, scaler) -> None:
    path = os.path.join(checkpoint, optimizer_file(args, plugin.sharded_optimizer_state))
    if not os.path.isfile(path):
        raise ValueError(f"{checkpoint!r} has no {os.path.basename(path)}: it was saved with save_only_model=True "
                         f"or another world size ({args.world_size} now); it cannot be resumed from")
    plugin.load_optimizer_state_dict(optimizer, torch.load(path, map_location=args.device, weights_only=True))
    lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))
    scaler_path = os.path.join(checkpoint, SCALER_NAME)
    if scaler is not None and os.path.isfile(scaler_path):
        scaler.load_state_dict(torch.load(scaler_path, weights_only=True))


def load_rng_state(checkpoint: str, args) -> None:
    path = os.path.join(checkpoint, rng_file(args))
    if not os.path.isfile(path):
        logger.warning("No %s in %s: the random state is not restored (resuming with another world size?)",
                       os.path.basename(path), checkpoint)
        return
    set_rng_states(torch.load(path, weights_only=False))  # python's RNG state is a tuple; written by this Trainer


def load_trainer_state(checkpoint: str) -> TrainerState:
    path = os.path.join(checkpoint, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        raise ValueError(f"resume_from_checkpoint={checkpoint!r} has no {TRAINER_STATE_NAME}: not a Trainer "
                         "checkpoint (or an incomplete one)")
    state = TrainerState.load_from_json(path)
    if state.best_model_checkpoint is not None and not os.path.isdir(state.best_model_checkpoint):
        logger.warning("The best checkpoint %s recorded in %s no longer exists; ignoring it",
                       state.best_model_checkpoint, path)
        state.best_model_checkpoint = None
    return state


def optimizer_file(args, sharded: bool) -> str:
    return f"rank{args.process_index}-of-{args.world_size}-{OPTIMIZER_NAME}" if sharded else OPTIMIZER_NAME


def rng_file(args) -> str:
    return "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"
