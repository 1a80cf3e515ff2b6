"""The Trainer on a tiny Llama and the stdlib corpus: learning, gradient accumulation, resuming, checkpoint rotation,
best-model tracking, crash-safe saving, mixed precision, evaluation and the saved Hugging Face directory.

Mirrors transformers' tests/trainer/test_trainer.py (test_gradient_accumulation, test_resume_training*,
test_checkpoint_rotation, test_load_best_model_at_end, test_save_checkpoints, test_evaluate/test_predict,
test_mixed_bf16, test_gradient_checkpointing, test_trainer_works_with_dict, test_no_wd_param_group), rewritten for
hf-lite with a local corpus in place of the hub's regression datasets; the interrupted-save cases are hf-lite's."""

import json
import os

import pytest
import torch
from hf_lite import AutoTokenizer, EvalPrediction, Trainer, TrainerCallback, get_last_checkpoint
from hf_lite_testing import corpus_blocks, logged, trainer_model, training_args


@pytest.fixture(scope="module")
def blocks(trained_tokenizer_dir):
    return corpus_blocks(trained_tokenizer_dir, n_blocks=32)


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_loss_decreases_on_the_corpus(tmp_path, blocks):
    trainer = Trainer(trainer_model(), training_args(tmp_path, max_steps=12, learning_rate=1e-2), train_dataset=blocks)
    out = trainer.train()
    losses = logged(trainer)
    assert len(losses) == 12 and out.global_step == 12
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert {"loss", "grad_norm", "learning_rate", "epoch"} <= set(trainer.state.log_history[0])
    assert {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss"} <= set(out.metrics)


def test_gradient_accumulation_4x1_equals_1x4(tmp_path, blocks):
    """transformers 5 normalises by the accumulated batch's token count, so 4 micro-batches of 1 are 1 batch of 4 --
    here with unequal token counts per row (ignored labels), where averaging per-micro-batch means would differ.
    Plain SGD, so the parameters carry the gradient itself (Adam's first steps hide its scale)."""
    data = [dict(b) for b in blocks[:8]]
    for i, b in enumerate(data):
        b["labels"] = b["labels"].clone()
        b["labels"][: 2 * i] = -100
    runs = {}
    for name, (bs, gas) in {"1x4": (4, 1), "4x1": (1, 4)}.items():
        args = training_args(
            tmp_path / name,
            per_device_train_batch_size=bs,
            gradient_accumulation_steps=gas,
            max_steps=2,
            learning_rate=1e-2,
        )
        model = trainer_model()
        trainer = Trainer(
            model, args, train_dataset=data, optimizers=(torch.optim.SGD(model.parameters(), lr=1.0), None)
        )
        trainer.train()
        runs[name] = (logged(trainer), _params(trainer.model))
    torch.testing.assert_close(runs["1x4"][0], runs["4x1"][0], rtol=1e-5, atol=1e-6)
    for key, value in runs["1x4"][1].items():
        torch.testing.assert_close(value, runs["4x1"][1][key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("resume_step", [4, 8])  # mid-epoch, and exactly at the end of epoch 1 (8 steps/epoch)
def test_resume_reproduces_the_uninterrupted_run(tmp_path, blocks, resume_step):
    kw = dict(
        max_steps=12,
        save_strategy="steps",
        save_steps=4,
        gradient_accumulation_steps=1,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.01,
    )
    full = Trainer(trainer_model(), training_args(tmp_path / "full", **kw), train_dataset=blocks)
    full.train()
    reference = logged(full)
    resumed = Trainer(trainer_model(seed=1), training_args(tmp_path / "full", **kw), train_dataset=blocks)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{resume_step}"))
    assert logged(resumed) == reference  # exactly: same data order, optimizer, schedule, RNG
    for key, value in _params(full.model).items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key


def test_resume_true_picks_the_newest_complete_checkpoint(tmp_path, blocks):
    args = training_args(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
    Trainer(trainer_model(), args, train_dataset=blocks).train()
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    os.rename(tmp_path / "checkpoint-6", tmp_path / "checkpoint-60")
    os.remove(tmp_path / "checkpoint-60" / "trainer_state.json")  # incomplete: never resumed from
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    trainer = Trainer(trainer_model(), training_args(tmp_path, max_steps=6), train_dataset=blocks)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6 and len(logged(trainer)) == 6
    with pytest.raises(ValueError, match="No valid checkpoint"):
        Trainer(trainer_model(), training_args(tmp_path / "empty"), train_dataset=blocks).train(True)


def test_interrupted_save_leaves_the_previous_checkpoint_usable(tmp_path, blocks, monkeypatch):
    args = training_args(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
    trainer = Trainer(trainer_model(), args, train_dataset=blocks)
    real_save = torch.save

    def failing_save(obj, f, *a, **kw):
        if trainer.state.global_step == 4 and isinstance(obj, dict) and "param_groups" in obj:
            raise OSError("disk full (simulated) while writing optimizer.pt")
        return real_save(obj, f, *a, **kw)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="simulated"):
        trainer.train()
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]  # no checkpoint-4, no staging directory left
    # A hard crash (no cleanup) leaves a hidden staging directory: it is never resumed from.
    (tmp_path / ".checkpoint-4.saving").mkdir()
    (tmp_path / ".checkpoint-4.saving" / "config.json").write_text("{}")
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    resumed = Trainer(trainer_model(seed=3), training_args(tmp_path, max_steps=6), train_dataset=blocks)
    resumed.train(resume_from_checkpoint=True)
    reference = Trainer(trainer_model(), training_args(tmp_path / "ref", max_steps=6), train_dataset=blocks)
    reference.train()
    assert logged(resumed) == logged(reference)


def test_save_total_limit_keeps_that_many_and_never_the_best(tmp_path, blocks):
    class PinBest(TrainerCallback):  # makes step 2's evaluation the best one, whatever the losses do
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            metrics["eval_score"] = 10.0 if state.global_step == 2 else float(state.global_step)

    args = training_args(
        tmp_path,
        max_steps=10,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=2,
        metric_for_best_model="score",
        greater_is_better=True,
        load_best_model_at_end=True,
    )
    trainer = Trainer(trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:8], callbacks=[PinBest()])
    trainer.train()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", "checkpoint-2"]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    assert trainer.state.best_metric == 10.0 and trainer.state.best_global_step == 2
    best = trainer_model()
    best.load_state_dict(_load_weights(tmp_path / "checkpoint-2"), strict=False)
    for key, value in best.state_dict().items():  # the best checkpoint's weights were loaded at the end
        assert torch.equal(value, trainer.model.state_dict()[key]), key


def _load_weights(directory):
    from safetensors.torch import load_file

    return load_file(os.path.join(directory, "model.safetensors"))


def test_save_total_limit_one_keeps_only_the_best(tmp_path, blocks):
    class PinBest(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            metrics["eval_score"] = -float(state.global_step)

    args = training_args(
        tmp_path,
        max_steps=6,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=1,
        metric_for_best_model="score",
        greater_is_better=True,
        load_best_model_at_end=True,
    )
    Trainer(trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:4], callbacks=[PinBest()]).train()
    assert os.listdir(tmp_path) == ["checkpoint-2"]


def test_save_model_writes_a_directory_transformers_loads(tmp_path, blocks, trained_tokenizer_dir):
    import transformers

    tok = AutoTokenizer.from_pretrained(trained_tokenizer_dir)
    tok.pad_token = "<pad>"  # the default collator (DataCollatorWithPadding) pads with it
    trainer = Trainer(
        trainer_model(), training_args(tmp_path / "out", max_steps=2), train_dataset=blocks, processing_class=tok
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    names = set(os.listdir(tmp_path / "final"))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "final").eval()
    their_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "final")
    ids = torch.tensor([their_tok("def f(x):\n    return x")["input_ids"]])
    assert ids.tolist() == [tok("def f(x):\n    return x")["input_ids"]]
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, trainer.model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_evaluate_and_predict(tmp_path, blocks):
    seen = {}

    def compute_metrics(p: EvalPrediction):
        seen["shapes"] = (tuple(p.predictions.shape), tuple(p.label_ids.shape))
        seen["types"] = (type(p.predictions).__name__, type(p.label_ids).__name__)
        return {"accuracy": (p.predictions[:, :-1].argmax(-1) == p.label_ids[:, 1:]).mean()}

    trainer = Trainer(
        trainer_model(),
        training_args(tmp_path),
        train_dataset=blocks,
        eval_dataset=blocks[:10],
        compute_metrics=compute_metrics,
    )
    metrics = trainer.evaluate()
    assert seen["shapes"] == ((10, 24, 800), (10, 24)) and seen["types"] == ("ndarray", "ndarray")
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and isinstance(metrics["eval_accuracy"], float)
    # eval_loss: per-batch token means weighted by the batches' sizes (8 rows, then 2), as transformers computes it
    model = trainer.model.eval()
    with torch.no_grad():
        means = [
            model(
                input_ids=torch.stack([b["input_ids"] for b in blocks[i:j]]),
                labels=torch.stack([b["labels"] for b in blocks[i:j]]),
            ).loss
            for i, j in ((0, 8), (8, 10))
        ]
    assert metrics["eval_loss"] == pytest.approx((8 * means[0] + 2 * means[1]).item() / 10, rel=1e-5)
    out = trainer.predict(blocks[:5])
    assert out.predictions.shape == (5, 24, 800) and out.label_ids.shape == (5, 24)
    assert set(out.metrics) >= {"test_loss", "test_accuracy", "test_runtime"}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, blocks, precision):
    args = training_args(tmp_path, max_steps=8, learning_rate=1e-2, **{precision: True})
    trainer = Trainer(trainer_model(), args, train_dataset=blocks)
    trainer.train()
    losses = logged(trainer)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert trainer.model.dtype == torch.float32  # autocast: the weights stay fp32
    assert (trainer.scaler is not None) == (precision == "fp16")


def test_fp16_checkpoint_saves_and_restores_the_grad_scaler(tmp_path, blocks):
    args = training_args(tmp_path, max_steps=4, fp16=True, save_strategy="steps", save_steps=2)
    trainer = Trainer(trainer_model(), args, train_dataset=blocks)
    trainer.train()
    assert "scaler.pt" in os.listdir(tmp_path / "checkpoint-2")
    resumed = Trainer(trainer_model(), training_args(tmp_path, max_steps=4, fp16=True), train_dataset=blocks)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.scaler.get_scale() == trainer.scaler.get_scale()
    assert logged(resumed) == logged(trainer)


def test_gradient_checkpointing_gives_the_same_steps(tmp_path, blocks):
    runs = []
    for flag in (False, True):
        trainer = Trainer(
            trainer_model(),
            training_args(tmp_path / str(flag), max_steps=3, gradient_checkpointing=flag),
            train_dataset=blocks,
        )
        trainer.train()
        assert trainer.model.is_gradient_checkpointing == flag
        runs.append(logged(trainer))
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-6)


def test_weight_decay_skips_biases_and_norms(tmp_path, blocks):
    trainer = Trainer(
        trainer_model(attention_bias=True), training_args(tmp_path, weight_decay=0.1), train_dataset=blocks
    )
    trainer.create_optimizer()
    decay, no_decay = trainer.optimizer.param_groups
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all("norm" in names[id(p)] or "bias" in names[id(p)] for p in no_decay["params"])
    assert not any("norm" in names[id(p)] or "bias" in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(trainer.model.parameters()))


def test_unused_columns_are_removed_and_iterable_datasets_train(tmp_path, blocks):
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            for b in blocks:
                yield {**b, "source": "stdlib", "row_id": 3}  # keys the model does not take

    trainer = Trainer(trainer_model(), training_args(tmp_path, max_steps=10), train_dataset=Stream())
    trainer.train()  # 32 rows / 4 = 8 steps per pass: the second pass re-iterates the stream
    assert trainer.state.global_step == 10 and len(logged(trainer)) == 10
    with pytest.raises(ValueError, match="max_steps"):
        Trainer(trainer_model(), training_args(tmp_path, max_steps=-1, num_train_epochs=1), train_dataset=Stream())


def test_include_num_input_tokens_seen_logs_throughput(tmp_path, blocks):
    trainer = Trainer(
        trainer_model(), training_args(tmp_path, max_steps=2, include_num_input_tokens_seen=True), train_dataset=blocks
    )
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["num_input_tokens_seen"] == 4 * 24 and first["train_tokens_per_second"] > 0
    assert json.loads(trainer.args.to_json_string())["include_num_input_tokens_seen"] == "all"


@pytest.mark.gpu(1)
def test_bf16_training_and_exact_resume_on_cuda(tmp_path, blocks):
    """The CUDA path (model, batches, loss accumulator, RNG state per device); it has not run yet: no GPU was lent to
    this package's sessions."""
    kw = dict(max_steps=6, bf16=True, save_strategy="steps", save_steps=3, learning_rate=1e-2)
    full = Trainer(trainer_model(), training_args(tmp_path, **kw), train_dataset=blocks)
    full.train()
    assert full.model.device.type == "cuda" and full.args.device.type == "cuda"
    losses = logged(full)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    resumed = Trainer(trainer_model(), training_args(tmp_path, **kw), train_dataset=blocks)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    # CUDA's embedding/attention backwards accumulate with atomics: close, not bitwise (CPU fp32 is bitwise above)
    torch.testing.assert_close(logged(resumed), losses, rtol=1e-2, atol=1e-3)


def test_dataloader_drop_last_applies_to_training_and_evaluation(tmp_path, blocks):
    args = training_args(
        tmp_path,
        dataloader_drop_last=True,
        per_device_train_batch_size=5,
        max_steps=-1,
        num_train_epochs=1,
        per_device_eval_batch_size=4,
    )
    trainer = Trainer(trainer_model(), args, train_dataset=blocks[:12], eval_dataset=blocks[:10])
    assert trainer.train().global_step == 2  # 12 rows in batches of 5: the short third batch is dropped
    loader, _ = trainer.get_eval_dataloader()
    assert [len(b["input_ids"]) for b in loader] == [4, 4]  # as transformers, the short last eval batch too


def test_save_only_model_checkpoints_hold_the_model_and_refuse_to_resume(tmp_path, blocks):
    args = training_args(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, save_only_model=True)
    Trainer(trainer_model(), args, train_dataset=blocks).train()
    files = set(os.listdir(tmp_path / "checkpoint-2"))
    assert {"model.safetensors", "config.json", "trainer_state.json"} <= files
    assert not files & {"optimizer.pt", "scheduler.pt", "rng_state.pth"}
    with pytest.raises(ValueError, match="has no optimizer.pt: it was saved with save_only_model=True"):
        Trainer(trainer_model(), training_args(tmp_path, max_steps=4), train_dataset=blocks).train(True)
