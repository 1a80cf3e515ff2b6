"""hf-lite: the Trainer with torch's DistributedDataParallel over the harness's process group (the default)."""

from __future__ import annotations

import time

from harness.pipelines.trainers import NotBuiltError
from harness.pipelines.trainers.common import build_model, finish_checkpoint, spec_of, training_blocks


def check(spec) -> None:
    import hf_lite

    missing = [name for name in ("Trainer", "TrainingArguments") if not hasattr(hf_lite, name)]
    if missing:
        raise NotBuiltError(f"hf-lite has no {', '.join(missing)} yet (issue 20); use --trainer ds-zero or mega-par")


class _Blocks:
    """A map-style dataset of fixed-length token blocks (labels = inputs: the model shifts them)."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return self.data.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


def _quiet_progress():
    """transformers' progress bar, showing the latest loss on the bar instead of printing every log line."""
    from hf_lite.trainer_callback import ProgressCallback

    class LossOnTheBar(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and self.training_bar is not None and logs and "loss" in logs:
                self.training_bar.set_postfix(loss=f"{logs['loss']:.3f}", refresh=False)

    return ProgressCallback, LossOnTheBar()


def train(rank: int, world_size: int, spec: dict) -> dict:
    from hf_lite import AutoTokenizer, Trainer, TrainingArguments, default_data_collator

    spec = spec_of(spec)
    data = training_blocks(spec)
    model = build_model(spec)
    args = TrainingArguments(
        output_dir=f"{spec.out_dir}/hf_lite_trainer",
        max_steps=spec.steps,
        per_device_train_batch_size=spec.micro_batch_size,
        learning_rate=spec.lr,
        warmup_steps=spec.warmup_steps,
        lr_scheduler_type="cosine",
        weight_decay=0.0,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps" if spec.options.get("save_steps") else "no",
        save_steps=spec.options.get("save_steps") or 500,
        report_to=[],
        seed=spec.seed,
        disable_tqdm=rank != 0,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_dir)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_Blocks(data),
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )  # fixed-length blocks: nothing to pad
    default_bar, bar = _quiet_progress()
    trainer.remove_callback(default_bar)
    trainer.add_callback(bar)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if spec.options.get("resume") else None)
    seconds = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    trainer.save_model(spec.checkpoint_dir)  # the main process writes, as transformers' Trainer does
    if rank == 0:
        finish_checkpoint(spec)
    return {
        "losses": losses,
        "seconds": seconds,
        "tokens": spec.steps * world_size * spec.micro_batch_size * data.shape[1],
    }
