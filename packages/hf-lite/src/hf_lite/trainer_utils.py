"""Trainer helpers with transformers' names (``trainer_utils.py``): seeding, strategies, checkpoint discovery and
rotation, speed metrics and the loop's return types."""

from __future__ import annotations

import enum
import logging
import os
import random
import re
import shutil
import sys
import time
from typing import Any, NamedTuple

import torch

logger = logging.getLogger(__name__)

PREFIX_CHECKPOINT_DIR = "checkpoint"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
SCALER_NAME = "scaler.pt"


class ExplicitEnum(str, enum.Enum):
    """A str enum whose error names the value and the choices (transformers' ``ExplicitEnum``)."""

    @classmethod
    def _missing_(cls, value):
        raise ValueError(f"{value!r} is not a valid {cls.__name__}, please select one of {[m.value for m in cls]}")


class IntervalStrategy(ExplicitEnum):
    NO, STEPS, EPOCH = "no", "steps", "epoch"


class SaveStrategy(ExplicitEnum):
    NO, STEPS, EPOCH, BEST = "no", "steps", "epoch", "best"


class SchedulerType(ExplicitEnum):
    LINEAR, COSINE, CONSTANT, CONSTANT_WITH_WARMUP = "linear", "cosine", "constant", "constant_with_warmup"


class OptimizerNames(ExplicitEnum):
    ADAMW_TORCH, ADAMW_TORCH_FUSED = "adamw_torch", "adamw_torch_fused"


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed ``random``, numpy (when loaded: hf-lite does not depend on it) and torch (CPU and every CUDA device)."""
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def seed_worker(worker_id: int, num_workers: int, rank: int) -> None:
    """DataLoader ``worker_init_fn``: a distinct, reproducible seed per (rank, worker)."""
    set_seed(torch.initial_seed() % 2**32 + worker_id + rank * num_workers)


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The ``checkpoint-N`` directory with the largest N that is complete (has ``trainer_state.json``).

    A save in progress is staged under a hidden name, so it never matches; a directory without its state file (written
    by hand or by another tool and cut short) is skipped with a warning rather than resumed from."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return None
    complete = []
    for path in sort_checkpoints(folder):
        if os.path.isfile(os.path.join(path, TRAINER_STATE_NAME)):
            complete.append(path)
        else:
            logger.warning("Skipping %s: it has no %s (an incomplete checkpoint)", path, TRAINER_STATE_NAME)
    return complete[-1] if complete else None


def sort_checkpoints(output_dir: str, checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR) -> list[str]:
    """``checkpoint-N`` directories, oldest (smallest N) first. transformers may sort by mtime; step order is what
    mtime approximates and it does not depend on the filesystem's clock resolution."""
    pattern = re.compile(rf"^{re.escape(checkpoint_prefix)}-(\d+)$")
    found = []
    for name in os.listdir(output_dir):
        match = pattern.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(match.group(1)), os.path.join(output_dir, name)))
    return [path for _, path in sorted(found)]


def rotate_checkpoints(output_dir: str, save_total_limit: int | None, best_model_checkpoint: str | None = None) -> None:
    """Delete the oldest checkpoints beyond ``save_total_limit``, never the newest (resume needs it) nor the best."""
    if save_total_limit is None or save_total_limit <= 0:
        return
    checkpoints = sort_checkpoints(output_dir)
    protected = {os.path.realpath(checkpoints[-1])} if checkpoints else set()
    if best_model_checkpoint is not None:
        protected.add(os.path.realpath(best_model_checkpoint))
    keep = max(save_total_limit, len(protected))
    remaining = len(checkpoints)
    for checkpoint in checkpoints:
        if remaining <= keep:
            break
        if os.path.realpath(checkpoint) not in protected:
            logger.info("Deleting older checkpoint [%s] due to args.save_total_limit", checkpoint)
            shutil.rmtree(checkpoint, ignore_errors=True)
            remaining -= 1


def speed_metrics(split: str, start_time: float, num_samples=None, num_steps=None, num_tokens=None) -> dict:
    """``{split}_runtime`` and per-second rates since ``start_time``."""
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    for name, count in (("samples", num_samples), ("steps", num_steps), ("tokens", num_tokens)):
        if count is not None:
            result[f"{split}_{name}_per_second"] = round(count / runtime, 3)
    return result


def has_length(dataset) -> bool:
    try:
        return len(dataset) is not None
    except TypeError:  # an IterableDataset without __len__
        return False


def detensorize(metrics: Any) -> Any:
    """0-d tensors (and numpy scalars) in metrics -> Python numbers, so they serialise to JSON."""
    if isinstance(metrics, dict):
        return {k: detensorize(v) for k, v in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(detensorize(v) for v in metrics)
    if torch.is_tensor(metrics) and metrics.numel() == 1:
        return metrics.item()
    if hasattr(metrics, "item") and getattr(metrics, "ndim", None) == 0:
        return metrics.item()
    return metrics


class EvalPrediction:
    """What ``compute_metrics`` receives: numpy predictions and labels (transformers' ``EvalPrediction``)."""

    def __init__(self, predictions, label_ids, inputs=None, losses=None):
        self.predictions, self.label_ids, self.inputs, self.losses = predictions, label_ids, inputs, losses

    def __iter__(self):  # (predictions, label_ids), then inputs and losses when given
        yield from [self.predictions, self.label_ids, *(x for x in (self.inputs, self.losses) if x is not None)]

    def __getitem__(self, idx):
        return tuple(self)[idx]


class EvalLoopOutput(NamedTuple):
    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict[str, float]
