"""What a Trainer checkpoint holds beside the model (transformers' ``trainer.py`` ``_save_optimizer_and_scheduler``,
``_save_rng_state`` and the ``_load_*`` of resuming): the optimizer (one file per rank when the plugin shards it), the
scheduler, the grad scaler, each rank's RNG states and trainer_state.json, written into a checkpoint directory and
read back; and ``save_checkpoint``, which assembles ``checkpoint-N`` from the model and these (the ``Trainer``'s
``_save_checkpoint``), with the best-model bookkeeping and its loading at the end of training."""

from __future__ import annotations

import logging
import os
import shutil

import torch

from ._infra.atomic_io import replace_directory, torch_save_synced
from ._infra.rng_state import get_rng_states, set_rng_states
from .checkpoint_utils import resolve_weight_files
from .core_model_loading import load_checkpoint
from .modeling_utils import PreTrainedModel
from .trainer_events import ExportableState, TrainerState
from .trainer_utils import (
    OPTIMIZER_NAME,
    PREFIX_CHECKPOINT_DIR,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    SaveStrategy,
    rotate_checkpoints,
)

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


def save_checkpoint(trainer, model) -> None:
    """``checkpoint-N``: every rank writes its files into the staging directory (``.checkpoint-N.saving``, a name
    ``get_last_checkpoint`` never matches; a fixed name, so every rank finds
    it without communicating; a stale one, from a crash, is cleared), then the main process renames it."""
    args, plugin = trainer.args, trainer.parallelism
    folder = f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
    final, stage = os.path.join(args.output_dir, folder), os.path.join(args.output_dir, f".{folder}.saving")
    trainer.store_flos()
    try:
        if args.should_save:
            shutil.rmtree(stage, ignore_errors=True)
        trainer._save(stage, state_dict=plugin.model_state_dict(model))
        if args.should_save:
            os.makedirs(stage, exist_ok=True)
        plugin.barrier()  # the staging directory exists before other ranks write into it
        if not args.save_only_model:
            save_training_state(stage, args, plugin, trainer.optimizer, trainer.lr_scheduler, trainer.scaler)
        track_best_checkpoint(trainer, final)
        if args.should_save:
            for cb in stateful_callbacks(trainer):
                name, cb_state = type(cb).__name__, cb.state()
                if isinstance(trainer.state.stateful_callbacks.get(name), list):
                    trainer.state.stateful_callbacks[name].append(cb_state)
                else:
                    trainer.state.stateful_callbacks[name] = cb_state
            trainer.state.save_to_json(os.path.join(stage, TRAINER_STATE_NAME))
        plugin.barrier()  # every rank's files are in the staging directory
        if args.should_save:
            replace_directory(stage, final)
    except BaseException:
        if args.should_save:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    if args.should_save:
        rotate_checkpoints(args.output_dir, args.save_total_limit, trainer.state.best_model_checkpoint)
    plugin.barrier()


def stateful_callbacks(trainer) -> list:
    """Callbacks (and the control) whose ``state()`` trainer_state.json keeps."""
    return [cb for cb in trainer.callback_handler.callbacks + [trainer.control] if isinstance(cb, ExportableState)]


def track_best_checkpoint(trainer, final: str) -> None:
    strategies = (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST)
    if trainer.args.save_strategy in strategies and trainer.state.best_global_step:
        best = os.path.join(trainer.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.best_global_step}")
        if best == final or os.path.isdir(best):
            trainer.state.best_model_checkpoint = best

# ------------------------------------------------------------------ resume


def load_callback_state(trainer) -> None:
    """Restore ExportableState callbacks (EarlyStoppingCallback's counter, TrainerControl) from the state, when
    ``restore_callback_states_from_checkpoint`` (off by default, as in transformers)."""
    if not trainer.args.restore_callback_states_from_checkpoint:
        return
    for cb in stateful_callbacks(trainer):
        saved = trainer.state.stateful_callbacks.get(type(cb).__name__)
        if saved is None:
            continue
        saved = saved[-1] if isinstance(saved, list) else saved
        for key, value in {**saved.get("args", {}), **saved.get("attributes", {})}.items():
            setattr(cb, key, value)


def load_best_model(trainer) -> None:
    best = trainer.state.best_model_checkpoint
    logger.info("Loading best model from %s (score: %s).", best, trainer.state.best_metric)
    model = trainer.parallelism.unwrap_model(trainer.model_wrapped)
    if not isinstance(model, PreTrainedModel):
        trainer.model = trainer.model_wrapped = model
    load_model_weights(model, best)
