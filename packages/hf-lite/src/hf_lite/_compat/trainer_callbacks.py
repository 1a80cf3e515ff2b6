"""transformers' built-in callbacks beyond the flow decisions (``trainer_callback.py``'s ``ProgressCallback``,
``PrinterCallback``, ``EarlyStoppingCallback``): progress bars or printed logs, which ``Trainer`` adds by
``disable_tqdm``, and stopping on a metric that stopped improving."""

from __future__ import annotations

import logging

from tqdm.auto import tqdm

from ..trainer_events import ExportableState, TrainerCallback
from ..trainer_utils import IntervalStrategy, has_length

logger = logging.getLogger(__name__)


def _format_logs(logs: dict) -> dict:
    return {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items() if k != "total_flos"}


class ProgressCallback(TrainerCallback):
    """tqdm bars for training (one tick per optimizer step) and for each evaluation; logs go through the bar."""

    def __init__(self, max_str_len: int = 100):
        self.training_bar = self.prediction_bar = None
        self.max_str_len = max_str_len
        self.current_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = tqdm(total=state.max_steps, initial=state.global_step, dynamic_ncols=True)
        self.current_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if state.is_world_process_zero and has_length(eval_dataloader):
            if self.prediction_bar is None:
                self.prediction_bar = tqdm(
                    total=len(eval_dataloader), leave=self.training_bar is None, dynamic_ncols=True
                )
            self.prediction_bar.update(1)

    def _close_prediction_bar(self, state):
        if state.is_world_process_zero and self.prediction_bar is not None:
            self.prediction_bar.close()
        self.prediction_bar = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_prediction_bar(state)

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._close_prediction_bar(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            shown = {
                k: (
                    f"[string of length {len(v)} > {self.max_str_len}]"
                    if isinstance(v, str) and len(v) > self.max_str_len
                    else v
                )
                for k, v in _format_logs(logs).items()
            }
            self.training_bar.write(str(shown))

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.close()
        self.training_bar = None


class PrinterCallback(TrainerCallback):
    """Prints each log dict (used instead of the bars when ``disable_tqdm``): user-facing output, so ``print``."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None:
            logs.pop("total_flos", None)  # from the caller's dict, as transformers' (train_results.json lacks it)
        if state.is_local_process_zero and logs is not None:
            print(_format_logs(logs))


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stop once ``metric_for_best_model`` has not improved on ``state.best_metric`` (by more than the threshold)
    for ``early_stopping_patience`` evaluations in a row."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0):
        if not isinstance(early_stopping_patience, int) or early_stopping_patience < 1:
            raise ValueError(f"early_stopping_patience={early_stopping_patience!r} must be a positive integer")
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold or 0.0
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args, state, control, metric_value):
        best = state.best_metric  # kept by the Trainer; on_evaluate runs before this evaluation updates it
        if best is None:
            self.early_stopping_patience_counter = 0
            return
        improved = metric_value > best if args.greater_is_better else metric_value < best
        if improved and abs(metric_value - best) > self.early_stopping_threshold:
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args, state, control, **kwargs):
        if args.metric_for_best_model is None:
            raise ValueError("EarlyStoppingCallback requires metric_for_best_model to be set")
        if args.eval_strategy == IntervalStrategy.NO:
            raise ValueError("EarlyStoppingCallback requires eval_strategy 'steps' or 'epoch', got 'no'")
        if not args.load_best_model_at_end:
            logger.warning(
                "Using EarlyStoppingCallback without load_best_model_at_end=True: the best model will not "
                "be loaded at the end."
            )

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        key = args.metric_for_best_model
        key = key if key.startswith("eval_") else f"eval_{key}"
        value = (metrics or {}).get(key)
        if value is None:
            logger.warning(
                "early stopping needs metric_for_best_model, but %s is not in the metrics: not stopping", key
            )
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }
