"""Trainer checkpoints (the checkpoint half of transformers' ``trainer.py``): ``checkpoint-N/`` holds the model as a
Hugging Face directory, optimizer, scheduler, grad scaler, per-rank RNG states and trainer_state.json.

A checkpoint is assembled under a hidden name (``.checkpoint-N.saving``) that ``get_last_checkpoint`` never matches;
every rank writes its files there, then the main process renames it into place. A save that fails (an exception,
or a crash) leaves the previous checkpoints as they were, and ``resume_from_checkpoint=True`` picks the newest
complete one."""

from __future__ import annotations

import logging
import os
import random
import shutil
import sys
import uuid

import torch

from .checkpoint_utils import resolve_weight_files
from .core_model_loading import load_checkpoint
from .modeling_utils import PreTrainedModel
from .trainer_callback import ExportableState, TrainerState
from .trainer_utils import (
    OPTIMIZER_NAME,
    PREFIX_CHECKPOINT_DIR,
    SCALER_NAME,
    SCHEDULER_NAME,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    SaveStrategy,
    rotate_checkpoints,
)
from .utils.atomic_io import _exchange, _fsync_directory, atomic_write_text

logger = logging.getLogger(__name__)


def _torch_save(obj, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _replace_directory(stage: str, final: str) -> None:
    """Put the finished ``stage`` at ``final``; an older ``final`` (a re-save of the same step) is swapped out in one
    step where the system can, else moved aside first (``final`` then briefly absent, never half-written)."""
    if not os.path.exists(final):
        os.rename(stage, final)
    elif _exchange(stage, final):
        shutil.rmtree(stage, ignore_errors=True)
    else:
        old = f"{stage}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
        os.rename(stage, final)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_directory(os.path.dirname(final))


def _optimizer_file(args, sharded: bool) -> str:
    return f"rank{args.process_index}-of-{args.world_size}-{OPTIMIZER_NAME}" if sharded else OPTIMIZER_NAME


def _rng_file(args) -> str:
    return "rng_state.pth" if args.world_size <= 1 else f"rng_state_{args.process_index}.pth"


class TrainerCheckpointMixin:
    """Saving and restoring checkpoints; mixed into ``Trainer``."""

    def _save_checkpoint(self, model) -> None:
        args, plugin = self.args, self.parallelism
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        final = os.path.join(args.output_dir, folder)
        # A fixed staging name, so every rank finds it without communicating; a stale one (a crash) is cleared.
        stage = os.path.join(args.output_dir, f".{folder}.saving")
        self.store_flos()
        try:
            if args.should_save:
                shutil.rmtree(stage, ignore_errors=True)
            self._save(stage, state_dict=plugin.model_state_dict(model))
            if args.should_save:
                os.makedirs(stage, exist_ok=True)
            plugin.barrier()  # the staging directory exists before other ranks write into it
            if not args.save_only_model:
                self._save_optimizer_and_scheduler(stage)
                self._save_rng_state(stage)
            self._track_best_checkpoint(final)
            if args.should_save:
                for cb in [
                    c for c in self.callback_handler.callbacks + [self.control] if isinstance(c, ExportableState)
                ]:
                    name, cb_state = type(cb).__name__, cb.state()
                    if isinstance(self.state.stateful_callbacks.get(name), list):
                        self.state.stateful_callbacks[name].append(cb_state)
                    else:
                        self.state.stateful_callbacks[name] = cb_state
                self.state.save_to_json(os.path.join(stage, TRAINER_STATE_NAME))
            plugin.barrier()  # every rank's files are in the staging directory
            if args.should_save:
                _fsync_directory(stage)
                _replace_directory(stage, final)
        except BaseException:
            if args.should_save:
                shutil.rmtree(stage, ignore_errors=True)
            raise
        if args.should_save:
            rotate_checkpoints(args.output_dir, args.save_total_limit, self.state.best_model_checkpoint)
        plugin.barrier()

    def _track_best_checkpoint(self, final: str) -> None:
        if (
            self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST)
            and self.state.best_global_step
        ):
            best = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}")
            if best == final or os.path.isdir(best):
                self.state.best_model_checkpoint = best

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        plugin, args = self.parallelism, self.args
        sharded = plugin.sharded_optimizer_state
        if sharded or args.should_save:
            _torch_save(
                plugin.optimizer_state_dict(self.optimizer), os.path.join(output_dir, _optimizer_file(args, sharded))
            )
        if args.should_save:
            _torch_save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
            if self.scaler is not None:
                _torch_save(self.scaler.state_dict(), os.path.join(output_dir, SCALER_NAME))

    def _save_rng_state(self, output_dir: str) -> None:
        states = {"python": random.getstate(), "cpu": torch.random.get_rng_state()}
        numpy = sys.modules.get("numpy")  # numpy's RNG matters only if something loaded numpy
        if numpy is not None:
            states["numpy"] = numpy.random.get_state()
        if torch.cuda.is_available():
            states["cuda"] = torch.cuda.random.get_rng_state_all()
        _torch_save(states, os.path.join(output_dir, _rng_file(self.args)))

    def _save(self, output_dir: str, state_dict=None) -> None:
        """The model as a Hugging Face directory (+ tokenizer files, + training_args.json), main process only."""
        if not self.args.should_save:
            return
        model = self.parallelism.unwrap_model(self.model)
        if state_dict is None:
            state_dict = self.parallelism.model_state_dict(self.model_wrapped)
        if isinstance(model, PreTrainedModel):
            model.save_pretrained(output_dir, state_dict=state_dict)
        else:
            from safetensors.torch import save_file

            logger.info("Trainer.model is not a PreTrainedModel: saving its state dict only")
            os.makedirs(output_dir, exist_ok=True)
            save_file(
                {k: v.contiguous() for k, v in state_dict.items()},
                os.path.join(output_dir, "model.safetensors"),
                metadata={"format": "pt"},
            )
        tokenizer = self.processing_class
        if tokenizer is None:
            tokenizer = getattr(self.data_collator, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save_pretrained(output_dir)
        atomic_write_text(os.path.join(output_dir, TRAINING_ARGS_NAME), self.args.to_json_string() + "\n")

    # ------------------------------------------------------------------ loading
    def _load_from_checkpoint(self, checkpoint: str) -> None:
        """Weights into ``self.model`` (every rank reads them, before wrapping)."""
        if not os.path.isdir(checkpoint):
            raise ValueError(f"resume_from_checkpoint={checkpoint!r} is not a directory")
        files = resolve_weight_files(checkpoint)
        model = self.model
        if isinstance(model, PreTrainedModel):
            info = load_checkpoint(model, files, ignore_mismatched_sizes=False)
            model.tie_weights()
            bad = {k: v for k, v in info.items() if k != "error_msgs" and v}
            if bad:
                raise ValueError(f"checkpoint {checkpoint!r} does not fit {type(model).__name__}: {bad}")
        else:
            from safetensors.torch import load_file

            state = {}
            for file in files:
                state.update(load_file(file))
            model.load_state_dict(state)

    def _load_optimizer_and_scheduler(self, checkpoint: str) -> None:
        plugin, args = self.parallelism, self.args
        path = os.path.join(checkpoint, _optimizer_file(args, plugin.sharded_optimizer_state))
        if not os.path.isfile(path):
            raise ValueError(
                f"{checkpoint!r} has no {os.path.basename(path)}: it was saved with save_only_model=True "
                f"or another world size ({args.world_size} now); it cannot be resumed from"
            )
        plugin.load_optimizer_state_dict(self.optimizer, torch.load(path, map_location=args.device, weights_only=True))
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))
        scaler_path = os.path.join(checkpoint, SCALER_NAME)
        if self.scaler is not None and os.path.isfile(scaler_path):
            self.scaler.load_state_dict(torch.load(scaler_path, weights_only=True))

    def _load_rng_state(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, _rng_file(self.args))
        if not os.path.isfile(path):
            logger.warning(
                "No %s in %s: the random state is not restored (resuming with another world size?)",
                os.path.basename(path),
                checkpoint,
            )
            return
        states = torch.load(path, weights_only=False)  # python's RNG state is a tuple; written by this Trainer
        random.setstate(states["python"])
        numpy = sys.modules.get("numpy")
        if numpy is not None and "numpy" in states:
            numpy.random.set_state(states["numpy"])
        torch.random.set_rng_state(states["cpu"])
        if torch.cuda.is_available() and "cuda" in states:
            torch.cuda.random.set_rng_state_all(states["cuda"])

    def _load_trainer_state(self, checkpoint: str) -> TrainerState:
        path = os.path.join(checkpoint, TRAINER_STATE_NAME)
        if not os.path.isfile(path):
            raise ValueError(
                f"resume_from_checkpoint={checkpoint!r} has no {TRAINER_STATE_NAME}: not a Trainer "
                "checkpoint (or an incomplete one)"
            )
        state = TrainerState.load_from_json(path)
        if state.best_model_checkpoint is not None and not os.path.isdir(state.best_model_checkpoint):
            logger.warning(
                "The best checkpoint %s recorded in %s no longer exists; ignoring it", state.best_model_checkpoint, path
            )
            state.best_model_checkpoint = None
        return state

    def _load_callback_state(self) -> None:
        """Restore ExportableState callbacks (EarlyStoppingCallback's counter, TrainerControl) from the state, when
        ``restore_callback_states_from_checkpoint`` (off by default, as in transformers)."""
        if not self.args.restore_callback_states_from_checkpoint:
            return
        for cb in self.callback_handler.callbacks + [self.control]:
            saved = self.state.stateful_callbacks.get(type(cb).__name__) if isinstance(cb, ExportableState) else None
            if saved is None:
                continue
            saved = saved[-1] if isinstance(saved, list) else saved
            for key, value in {**saved.get("args", {}), **saved.get("attributes", {})}.items():
                setattr(cb, key, value)

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        logger.info("Loading best model from %s (score: %s).", best, self.state.best_metric)
        model = self.parallelism.unwrap_model(self.model_wrapped)
        if isinstance(model, PreTrainedModel):
            info = load_checkpoint(model, resolve_weight_files(best), ignore_mismatched_sizes=False)
            model.tie_weights()
            if info["missing_keys"] or info["unexpected_keys"]:
                raise ValueError(f"best checkpoint {best!r} does not fit the model: {info}")
        else:
            self.model = self.model_wrapped = model
            self._load_from_checkpoint(best)
