"""transformers' ``Trainer`` as scripts use it: the core loop (``trainer_loop.py``) with transformers' defaults around
it, set up once in ``__init__`` (``TrainingArguments()`` when none is given; torch.distributed from torchrun's
environment and torch's DDP, ``_compat/torch_ddp.py``; the default collator; the ``report_to`` integrations; progress
bars or printed logs; the process's log level; the checks of the datasets against the arguments), and the methods of
transformers' surface that the loop itself never calls: ``add_callback`` / ``pop_callback`` / ``remove_callback``,
``predict``, and what scripts call after training: ``log_metrics``, ``save_metrics``, ``save_state``,
``create_model_card`` (transformers' ``trainer_pt_utils`` / ``modelcard``; written by the main process only) and
``end``; and the hub pushes of ``TrainingArguments(push_to_hub=True)``: the repo created at construction, the
output directory (and, by ``hub_strategy``, the checkpoint) pushed at each save by a callback, ``push_to_hub`` at
``save_model`` and at the end (transformers' ``init_hf_repo``, ``_push_from_checkpoint``, ``push_to_hub``; the hub
calls are in ``_infra/hub.py``). It overrides no step of the loop."""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import os
import shutil

import torch

from .._infra import hub
from .._infra.atomic_io import atomic_write_text
from ..checkpoint_utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
from ..configuration_utils import CONFIG_NAME
from ..generation.configuration_utils import GENERATION_CONFIG_NAME
from ..trainer_events import TrainerCallback
from ..trainer_loop import Trainer as TrainerLoop
from ..trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    TRAINER_STATE_NAME,
    TRAINING_ARGS_NAME,
    PredictionOutput,
    SaveStrategy,
    has_length,
    set_seed,
)
from .data_collator import DataCollatorWithPadding, default_data_collator
from .integrations import get_reporting_integration_callbacks
from .modelcard import card_tags, trainer_model_card
from .torch_ddp import TorchDDPPlugin, destroy_distributed, init_distributed
from .trainer_callbacks import PrinterCallback, ProgressCallback
from .trainer_utils import enable_full_determinism
from .training_args import HubStrategy, TrainingArguments

logger = logging.getLogger(__name__)


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


class _PushToHubCallback(TrainerCallback):
    """Pushes after each checkpoint save and waits for the pushes at the end of training (where transformers'
    ``_save_checkpoint`` and ``train`` do it)."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self.trainer._push_from_checkpoint(folder)

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer._finish_current_push()


class Trainer(TrainerLoop):
    """Train, evaluate and save a model with the arguments of ``TrainingArguments``.

    ``parallelism`` (hf-lite's addition) is a ``DataParallelPlugin``: how the model and optimizer are wrapped and
    stepped on several ranks. The default is torch's DDP over the default process group."""

    def __init__(self, model=None, args: TrainingArguments | None = None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, model_init=None, compute_loss_func=None,
                 compute_metrics=None, callbacks=None, optimizers=(None, None), optimizer_cls_and_kwargs=None,
                 preprocess_logits_for_metrics=None, parallelism=None):
        if args is None:
            args = TrainingArguments(output_dir="tmp_trainer")
        if not isinstance(args, TrainingArguments):
            raise TypeError(f"args must be a TrainingArguments, got {type(args).__name__}")
        self.model_init = model_init
        if model_init is not None and optimizers[0] is not None:
            raise RuntimeError("Passing a `model_init` is incompatible with providing the `optimizers` argument. You "
                               "should subclass `Trainer` and override the `create_optimizer_and_scheduler` method.")
        if model is None:
            if model_init is None:
                raise RuntimeError("`Trainer` requires either a `model` or `model_init` argument")
            self._seed(args)
            model = self.call_model_init()
        elif model_init is not None:
            logger.warning("`Trainer` requires either a `model` or `model_init` argument, but not both. `model_init` "
                           "will overwrite your model when calling the `train` method.")
        args.check_supported()
        if args.full_determinism:
            enable_full_determinism(args.seed)
        self._owns_process_group = init_distributed(args)
        if args.get_process_log_level() >= 0:
            logging.getLogger("hf_lite").setLevel(args.get_process_log_level())
        _check_datasets(args, train_dataset, eval_dataset)
        if data_collator is None:
            pad = hasattr(processing_class, "pad")
            data_collator = DataCollatorWithPadding(processing_class) if pad else default_data_collator
        progress = PrinterCallback if args.disable_tqdm else ProgressCallback
        callbacks = [*get_reporting_integration_callbacks(args.report_to), *(callbacks or []), progress]
        if args.push_to_hub:
            callbacks.insert(0, _PushToHubCallback(self))
        super().__init__(
            model, args, data_collator, train_dataset, eval_dataset, processing_class, compute_loss_func,
            compute_metrics, callbacks, optimizers, preprocess_logits_for_metrics,
            parallelism if parallelism is not None else TorchDDPPlugin(),
        )
        if optimizer_cls_and_kwargs is not None and optimizers[0] is not None:
            raise RuntimeError("Passing both `optimizers` and `optimizer_cls_and_kwargs` arguments is incompatible.")
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self.hub_model_id, self.push_in_progress = None, None  # set by init_hf_repo
        if args.push_to_hub:
            self.init_hf_repo()

    @staticmethod
    def _seed(args) -> None:
        (enable_full_determinism if args.full_determinism else set_seed)(args.seed)

    def call_model_init(self, trial=None):
        """A fresh model from ``model_init()`` (or ``model_init(trial)``)."""
        takes_trial = len(inspect.signature(self.model_init).parameters) > 0
        model = self.model_init(trial) if takes_trial else self.model_init()
        if model is None:
            raise RuntimeError("model_init should not return None.")
        return model

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None):
        """The core ``train`` with transformers' signature. With ``model_init`` the model is made anew first (after
        seeding) with a new optimizer and schedule, as in transformers. ``trial`` belongs to hyper-parameter search,
        which hf-lite has not."""
        if trial is not None:
            raise ValueError("trial: hf-lite's Trainer has no hyperparameter_search; call train() without a trial")
        if self.model_init is not None:
            self._seed(self.args)
            model = self.call_model_init().to(self.args.device)
            if getattr(model, "config", None) is not None:
                model.config.use_cache = self.args.use_cache
            self.model = self.model_wrapped = self.callback_handler.model = model
            self.optimizer = self.lr_scheduler = None
            self.callback_handler.optimizer = self.callback_handler.lr_scheduler = None
        return super().train(resume_from_checkpoint, ignore_keys_for_eval)

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

    def get_num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def get_learning_rates(self) -> list[float]:
        """The current learning rate of each optimizer parameter group."""
        if self.optimizer is None:
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_optimizer_group(self, param: str | torch.nn.parameter.Parameter | None = None):
        """The optimizer group holding ``param``, or every group's parameters."""
        if self.optimizer is None:
            raise ValueError("Trainer optimizer is None, please make sure you have setup the optimizer before.")
        if param is not None:
            for group in self.optimizer.param_groups:
                if any(param is p for p in group["params"]):
                    return group
        return [group["params"] for group in self.optimizer.param_groups]

    def create_optimizer(self, model=None):
        """The core's AdamW groups (decay / no decay); with ``optimizer_cls_and_kwargs`` the same groups go to that
        class with those kwargs alone (as in transformers: no learning rate is added)."""
        if model is not None and model is not self.model:
            raise ValueError("create_optimizer(model=...): hf-lite builds the optimizer of Trainer.model only")
        if self.optimizer is not None or self.optimizer_cls_and_kwargs is None:
            return super().create_optimizer()
        adamw_groups = super().create_optimizer().param_groups
        optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in adamw_groups]
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def get_tp_size(self) -> int:
        """Tensor-parallel ranks: 1 (hf-lite parallelises data only; another engine comes through ``parallelism``)."""
        return 1

    def get_cp_size(self) -> int:
        return 1

    def get_sp_size(self) -> int:
        return 1

    def get_total_train_batch_size(self, args) -> int:
        """Examples per optimizer step over all ranks."""
        return args.train_batch_size * args.gradient_accumulation_steps * args.world_size

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self.create_optimizer()
        self.create_scheduler(num_training_steps=num_training_steps)

    def num_examples(self, dataloader) -> int:
        """The examples a data loader goes through (its dataset's length, else batches x batch size)."""
        try:
            dataset = dataloader.dataset
            return len(getattr(dataset, "dataset", dataset) if type(dataset).__name__ == "IterableDatasetShard"
                       else dataset)
        except (AttributeError, TypeError):
            return len(dataloader) * self.args.per_device_train_batch_size

    @staticmethod
    def metrics_format(metrics: dict[str, float]) -> dict:
        """Metrics for reading: memory in MB, runtimes as h:mm:ss.cc, FLOs in GF, floats to 4 decimals."""
        out = dict(metrics)
        for key, value in out.items():
            if "_mem_" in key:
                out[key] = f"{value >> 20}MB"
            elif "_runtime" in key:
                out[key] = f"{datetime.timedelta(seconds=int(value))}.{int(abs(value - int(value)) * 100):02d}"
            elif key == "total_flos":
                out[key] = f"{int(value) >> 30}GF"
            elif isinstance(value, float):
                out[key] = round(value, 4)
        return out

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
        formatted = self.metrics_format(metrics)
        width = max((len(k) for k in formatted), default=0)
        value_width = max((len(str(v)) for v in formatted.values()), default=0)
        for key in sorted(formatted):
            logger.info("  %s = %s", key.ljust(width), str(formatted[key]).rjust(value_width))

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
        """README.md in ``output_dir``: transformers' generated card (``_compat/modelcard.py``): metadata with
        ``generated_from_trainer``, the last evaluation, the hyper-parameters, the evaluations during training."""
        if not self.is_world_process_zero():
            return
        path = os.path.join(self.args.output_dir, "README.md")
        if os.path.exists(path) and tags is not None:  # the tags of the card already there are kept
            existing = card_tags(path)
            tags = [tags] if isinstance(tags, str) else list(tags)
            tags += [tag for tag in existing if tag not in tags]
        card = trainer_model_card(self, self.parallelism.unwrap_model(self.model), language, license, tags,
                                  model_name, finetuned_from, tasks, dataset_tags, dataset, dataset_args)
        os.makedirs(self.args.output_dir, exist_ok=True)
        atomic_write_text(path, card)

    # ------------------------------------------------------------------ hub pushes (transformers' trainer.py)
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The core ``save_model``; called by a script with ``push_to_hub=True``, it pushes the output directory."""
        super().save_model(output_dir, _internal_call)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the repo ``args.hub_model_id`` (default: the output directory's name) if needed."""
        if not self.is_world_process_zero():
            return
        name = self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))
        token = token if token is not None else self.args.hub_token
        private = private if private is not None else self.args.hub_private_repo
        self.hub_model_id = hub.create_repo(name, token=token, private=private)
        self.push_in_progress = None

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None, **kwargs):
        """Save the model, write the model card (``kwargs`` go to ``create_model_card``) and upload the output
        directory without its checkpoints in one commit; a ``Future`` when not ``blocking``."""
        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        model_name = kwargs.pop("model_name", None)
        if model_name is None and self.args.should_save:
            model_name = (self.args.hub_model_id or os.path.abspath(self.args.output_dir)).split("/")[-1]
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        model_tags = getattr(self.parallelism.unwrap_model(self.model), "model_tags", None)
        if model_tags:
            tags = kwargs.get("tags") or []
            tags = [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = tags + [t for t in model_tags if t not in tags]
        self.create_model_card(model_name=model_name, **kwargs)
        self._finish_current_push()
        return hub.upload_folder(repo_id=self.hub_model_id, folder_path=self.args.output_dir,
                                 commit_message=commit_message, token=token, run_as_future=not blocking,
                                 ignore_patterns=["_*", f"{PREFIX_CHECKPOINT_DIR}-*"],
                                 revision=revision if revision is not None else self.args.hub_revision)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """The checkpoint's model files copied into the output directory, the tokenizer and arguments saved there,
        and the directory pushed in the background; with ``hub_strategy`` ``checkpoint`` / ``all_checkpoints`` the
        checkpoint itself too (as ``last-checkpoint`` / its own name). Skipped while the last push runs, unless
        ``hub_always_push``."""
        args = self.args
        if not self.is_world_process_zero() or args.hub_strategy == HubStrategy.END:
            return
        if not args.hub_always_push and self.push_in_progress is not None and not self.push_in_progress.is_done():
            return
        self.callback_handler.on_push_begin(args, self.state, self.control)
        files = [CONFIG_NAME, GENERATION_CONFIG_NAME, "pytorch_model.bin", SAFE_WEIGHTS_NAME]
        for index in ("pytorch_model.bin.index.json", SAFE_WEIGHTS_INDEX_NAME):
            if os.path.isfile(os.path.join(checkpoint_folder, index)):
                with open(os.path.join(checkpoint_folder, index), encoding="utf-8") as f:
                    files += [index, *sorted(set(json.load(f)["weight_map"].values()))]
        for name in files:
            if os.path.isfile(os.path.join(checkpoint_folder, name)):
                shutil.copy(os.path.join(checkpoint_folder, name), os.path.join(args.output_dir, name))
        if self.processing_class is not None:
            self.processing_class.save_pretrained(args.output_dir)
        atomic_write_text(os.path.join(args.output_dir, TRAINING_ARGS_NAME), args.to_json_string() + "\n")
        if args.save_strategy == SaveStrategy.STEPS:
            message = f"Training in progress, step {self.state.global_step}"
        else:
            message = f"Training in progress, epoch {int(self.state.epoch)}"
        jobs = [hub.upload_folder(repo_id=self.hub_model_id, folder_path=args.output_dir, commit_message=message,
                                  token=args.hub_token, run_as_future=True, revision=args.hub_revision,
                                  ignore_patterns=["_*", f"{PREFIX_CHECKPOINT_DIR}-*"])]
        if args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            path_in_repo = ("last-checkpoint" if args.hub_strategy == HubStrategy.CHECKPOINT
                            else os.path.basename(checkpoint_folder))
            jobs.append(hub.upload_folder(repo_id=self.hub_model_id, folder_path=checkpoint_folder,
                                          path_in_repo=path_in_repo, commit_message=message + ", checkpoint",
                                          token=args.hub_token, run_as_future=True, revision=args.hub_revision))
        if self.push_in_progress is None or self.push_in_progress.is_done():
            self.push_in_progress = hub.PushInProgress(jobs)
        else:
            self.push_in_progress.jobs.extend(jobs)

    def _finish_current_push(self) -> None:
        """Wait for the checkpoint pushes still running."""
        if self.push_in_progress is not None and not self.push_in_progress.is_done():
            logger.info("Waiting for the current checkpoint push to be finished, this might take a couple of minutes.")
            self.push_in_progress.wait_until_done()
