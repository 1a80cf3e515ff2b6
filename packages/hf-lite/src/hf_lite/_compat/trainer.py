"""transformers' ``Trainer`` as scripts use it: the core loop (``trainer_loop.py``) with transformers' defaults around
it, set up once in ``__init__`` (``TrainingArguments()`` when none is given; torch.distributed from torchrun's
environment and torch's DDP, ``_compat/torch_ddp.py``; the default collator; the ``report_to`` integrations; progress
bars or printed logs; the process's log level; the checks of the datasets against the arguments), and the methods of
transformers' surface that the loop itself never calls: ``add_callback`` / ``pop_callback`` / ``remove_callback``,
``predict``, and what scripts call after training: ``log_metrics``, ``save_metrics``, ``save_state``,
``create_model_card`` (transformers' ``trainer_pt_utils`` / ``modelcard``; written by the main process only) and
``end``. It overrides no step of the loop."""

from __future__ import annotations

import json
import logging
import os

import torch

from .._infra.atomic_io import atomic_write_text
from ..trainer_loop import Trainer as TrainerLoop
from ..trainer_utils import TRAINER_STATE_NAME, PredictionOutput, has_length
from .data_collator import DataCollatorWithPadding, default_data_collator
from .integrations import get_reporting_integration_callbacks
from .torch_ddp import TorchDDPPlugin, destroy_distributed, init_distributed
from .trainer_callbacks import PrinterCallback, ProgressCallback
from .training_args import TrainingArguments

logger = logging.getLogger(__name__)


def _format(key: str, value):
    if "_memory_" in key:
        return f"{value >> 20}MB"
    if key == "total_flos":
        return f"{value / 1e9:.0f}GF" if value >= 1e9 else f"{value:.0f}"
    return f"{value:.4g}" if isinstance(value, float) else value


def _check_datasets(args, train_dataset, eval_dataset) -> None:
    """What the arguments need of the datasets, checked at construction."""
    if args.eval_strategy != "no" and eval_dataset is None:
        raise ValueError(
            f"eval_strategy={args.eval_strategy.value!r} but no eval_dataset was passed to the "
            "Trainer: pass one or set eval_strategy='no'"
        )
    if args.load_best_model_at_end and eval_dataset is None:
        raise ValueError("load_best_model_at_end=True needs an eval_dataset")
    if train_dataset is not None and not has_length(train_dataset) and args.max_steps <= 0:
        raise ValueError("The train_dataset has no length (an IterableDataset): set max_steps to a positive value")
    if args.fp16 and args.device.type == "cpu" and not hasattr(torch.amp, "GradScaler"):
        raise ValueError("fp16=True on CPU needs torch.amp.GradScaler (torch >= 2.3)")


class Trainer(TrainerLoop):
    """Train, evaluate and save a model with the arguments of ``TrainingArguments``.

    ``parallelism`` (hf-lite's addition) is a ``DataParallelPlugin``: how the model and optimizer are wrapped and
    stepped on several ranks. The default is torch's DDP over the default process group."""

    def __init__(self, model=None, args: TrainingArguments | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, compute_loss_func=None, compute_metrics=None,
                 callbacks=None, optimizers=(None, None), preprocess_logits_for_metrics=None, parallelism=None):
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        if not isinstance(args, TrainingArguments):
            raise TypeError(f"args must be a TrainingArguments, got {type(args).__name__}")
        if model is None:
            raise ValueError("Trainer requires a `model`")
        self._owns_process_group = init_distributed(args)
        if args.get_process_log_level() >= 0:
            logging.getLogger("hf_lite").setLevel(args.get_process_log_level())
        _check_datasets(args, train_dataset, eval_dataset)
        if data_collator is None:
            pad = hasattr(processing_class, "pad")
            data_collator = DataCollatorWithPadding(processing_class) if pad else default_data_collator
        progress = PrinterCallback if args.disable_tqdm else ProgressCallback
        callbacks = [*get_reporting_integration_callbacks(args.report_to), *(callbacks or []), progress]
        super().__init__(
            model, args, data_collator, train_dataset, eval_dataset, processing_class, compute_loss_func,
            compute_metrics, callbacks, optimizers, preprocess_logits_for_metrics,
            parallelism if parallelism is not None else TorchDDPPlugin(),
        )

    def add_callback(self, callback) -> None:
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback):
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback) -> None:
        self.callback_handler.remove_callback(callback)

    def get_test_dataloader(self, test_dataset):
        return self._eval_loader(test_dataset)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions (numpy logits, right-padded with -100 to one length), labels if present, and metrics."""
        output = self._run_evaluation(self.get_test_dataloader(test_dataset), "Prediction", ignore_keys,
                                      metric_key_prefix)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=output.metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics)

    def end(self) -> None:
        """Call once at the very end of a script: destroys the process group the Trainer created under torchrun
        (after a barrier); train/evaluate/predict/save_model communicate and fail after it (transformers 5.24)."""
        if self._owns_process_group:
            destroy_distributed()
            self._owns_process_group = False

    def log_metrics(self, split: str, metrics: dict) -> None:
        if not self.is_world_process_zero():
            return
        logger.info("***** %s metrics *****", split)
        width = max((len(k) for k in metrics), default=0)
        for key in sorted(metrics):
            logger.info("  %s = %s", key.ljust(width), _format(key, metrics[key]))

    def save_metrics(self, split: str, metrics: dict, combined: bool = True) -> None:
        """``{split}_results.json``, and with ``combined`` the union of every split in ``all_results.json``."""
        if not self.is_world_process_zero():
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        path = os.path.join(self.args.output_dir, f"{split}_results.json")
        atomic_write_text(path, json.dumps(metrics, indent=4, sort_keys=True) + "\n")
        if combined:
            all_path = os.path.join(self.args.output_dir, "all_results.json")
            merged = {}
            if os.path.isfile(all_path):
                with open(all_path, encoding="utf-8") as f:
                    merged = json.load(f)
            merged.update(metrics)
            atomic_write_text(all_path, json.dumps(merged, indent=4, sort_keys=True) + "\n")

    def save_state(self) -> None:
        """``trainer_state.json`` of the run in ``output_dir`` (beside the final model)."""
        if not self.is_world_process_zero():
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        self.state.save_to_json(os.path.join(self.args.output_dir, TRAINER_STATE_NAME))

    def create_model_card(
        self,
        language: str | None = None,
        license: str | None = None,
        tags: str | list[str] | None = None,
        model_name: str | None = None,
        finetuned_from: str | None = None,
        tasks: str | list[str] | None = None,
        dataset_tags: str | list[str] | None = None,
        dataset: str | list[str] | None = None,
        dataset_args: str | list[str] | None = None,
    ) -> None:
        """A README.md in ``output_dir``: YAML metadata, what was trained from what, the last evaluation and the
        hyper-parameters (the sections of transformers' generated card; written locally, never pushed)."""
        if not self.is_world_process_zero():
            return
        name = model_name or os.path.basename(os.path.abspath(self.args.output_dir))
        meta = {"library_name": "hf-lite", "license": license, "language": language, "base_model": finetuned_from,
                "tags": [tags] if isinstance(tags, str) else tags, "datasets": dataset_tags,
                "pipeline_tag": tasks if isinstance(tasks, str) else None}
        lines = ["---", *(f"{k}: {json.dumps(v)}" for k, v in meta.items() if v), "---", "", f"# {name}", ""]
        source = f"a fine-tuned version of [{finetuned_from}]({finetuned_from})" if finetuned_from else "trained"
        on = f" on the {dataset} dataset" if dataset else ""
        lines += [f"This model is {source}{on}.", ""]
        evals = [h for h in self.state.log_history if "eval_loss" in h]
        if evals:
            lines += ["It achieves the following results on the evaluation set:"]
            lines += [f"- {k.removeprefix('eval_')}: {_format(k, v)}" for k, v in sorted(evals[-1].items())
                      if k.startswith("eval_")]
            lines.append("")
        args = self.args
        hyper = {"learning_rate": args.learning_rate, "train_batch_size": args.per_device_train_batch_size,
                 "eval_batch_size": args.per_device_eval_batch_size, "seed": args.seed,
                 "gradient_accumulation_steps": args.gradient_accumulation_steps,
                 "optimizer": args.optim.value if hasattr(args.optim, "value") else args.optim,
                 "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type),
                 "num_epochs": args.num_train_epochs}
        if args.max_steps > 0:
            hyper["training_steps"] = args.max_steps
        lines += ["## Training hyperparameters", "", *(f"- {k}: {v}" for k, v in hyper.items()), ""]
        atomic_write_text(os.path.join(args.output_dir, "README.md"), "\n".join(lines))
