"""Callbacks: the events in their documented order, adding/removing callbacks, control flow, EarlyStoppingCallback,
the progress/printer callbacks, the JSON-lines logger, TensorBoard when installed, TrainerState's JSON.

Mirrors transformers' tests/trainer/test_trainer_callback.py (test_init_callback, test_add_remove_callback,
test_event_flow with its get_expected_events, test_stateful_callbacks, test_missing_stateful_callback) and the early
stopping cases of tests/trainer/test_trainer.py (test_early_stopping_callback)."""

import importlib.util
import json
import os

import pytest
from hf_lite import (
    DefaultFlowCallback,
    EarlyStoppingCallback,
    JSONLinesCallback,
    PrinterCallback,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainerState,
)
from hf_lite.trainer_callback import EVENTS
from hf_lite_testing import corpus_blocks, logged, trainer_model, training_args

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="module")
def blocks(trained_tokenizer_dir):
    return corpus_blocks(trained_tokenizer_dir, n_blocks=16)


class EventRecorder(TrainerCallback):
    def __init__(self):
        self.events = []
        for name in EVENTS:
            setattr(self, name, self._recorder(name))

    def _recorder(self, name):
        def record(args, state, control, **kwargs):
            self.events.append(name)

        return record


def expected_events(trainer, n_eval_batches: int) -> list[str]:
    """transformers' get_expected_events, with on_substep_end for gradient accumulation."""
    args, state = trainer.args, trainer.state
    evaluation = ["on_prediction_step"] * n_eval_batches + ["on_log", "on_evaluate"]
    events, step = ["on_init_end", "on_train_begin"], 0
    batches = len(trainer.get_train_dataloader())
    for _ in range(state.num_train_epochs):
        events.append("on_epoch_begin")
        for _ in range(batches // args.gradient_accumulation_steps):
            step += 1
            events += ["on_step_begin"] + ["on_substep_end"] * (args.gradient_accumulation_steps - 1)
            events += ["on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]
            if step % args.logging_steps == 0:
                events.append("on_log")
            if args.eval_strategy == "steps" and step % args.eval_steps == 0:
                events += evaluation
            if args.save_strategy == "steps" and (step % args.save_steps == 0 or step == state.max_steps):
                events.append("on_save")
        events.append("on_epoch_end")
        if args.eval_strategy == "epoch":
            events += evaluation
        if args.save_strategy == "epoch":
            events.append("on_save")
    return events + ["on_log", "on_train_end"]


@pytest.mark.parametrize(
    "kw",
    [
        dict(logging_steps=1),
        dict(logging_steps=3, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=3),
        dict(logging_steps=2, gradient_accumulation_steps=2, eval_strategy="epoch", save_strategy="epoch"),
    ],
    ids=["log-every-step", "eval-and-save-by-steps", "accumulation-epoch-strategies"],
)
def test_events_arrive_in_the_documented_order(tmp_path, blocks, kw):
    recorder = EventRecorder()
    args = training_args(tmp_path, max_steps=-1, num_train_epochs=2, per_device_train_batch_size=4, **kw)
    trainer = Trainer(trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:6], callbacks=[recorder])
    trainer.train()
    n_eval = len(trainer.get_eval_dataloader()[0])
    assert recorder.events == expected_events(trainer, n_eval)
    recorder.events.clear()
    trainer.predict(blocks[:3])
    assert recorder.events == ["on_prediction_step", "on_predict"]


def test_default_callbacks_and_add_pop_remove(tmp_path, blocks):
    trainer = Trainer(trainer_model(), training_args(tmp_path, disable_tqdm=False), train_dataset=blocks)
    assert [type(cb) for cb in trainer.callback_handler.callbacks] == [DefaultFlowCallback, ProgressCallback]
    trainer = Trainer(trainer_model(), training_args(tmp_path), train_dataset=blocks, callbacks=[EventRecorder])
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert kinds == [DefaultFlowCallback, EventRecorder, PrinterCallback]
    popped = trainer.pop_callback(EventRecorder)
    assert isinstance(popped, EventRecorder) and EventRecorder not in [
        type(c) for c in trainer.callback_handler.callbacks
    ]
    trainer.add_callback(popped)
    trainer.remove_callback(popped)
    assert [type(c) for c in trainer.callback_handler.callbacks] == [DefaultFlowCallback, PrinterCallback]
    trainer.remove_callback(PrinterCallback)
    assert [type(c) for c in trainer.callback_handler.callbacks] == [DefaultFlowCallback]


def test_a_callback_can_stop_training_and_request_logs(tmp_path, blocks):
    class StopAtThree(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_log = True  # log every step although logging_steps is large
            if state.global_step == 3:
                control.should_training_stop = True
            return control

    trainer = Trainer(
        trainer_model(),
        training_args(tmp_path, max_steps=10, logging_steps=100),
        train_dataset=blocks,
        callbacks=[StopAtThree()],
    )
    out = trainer.train()
    assert out.global_step == 3 and len(logged(trainer)) == 3


def test_early_stopping_stops_when_the_metric_stops_improving(tmp_path, blocks):
    class WorseningScore(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            metrics["eval_score"] = 1.0 if state.global_step == 2 else 0.5  # best at step 2, then never better

    args = training_args(
        tmp_path,
        max_steps=20,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="score",
        greater_is_better=True,
    )
    early = EarlyStoppingCallback(early_stopping_patience=2)
    trainer = Trainer(
        trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:4], callbacks=[WorseningScore(), early]
    )
    trainer.train()
    assert trainer.state.global_step == 6  # evaluations at 4 and 6 fail to improve: patience 2 reached
    assert early.early_stopping_patience_counter == 2
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    saved = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["EarlyStoppingCallback"]["attributes"] == {"early_stopping_patience_counter": 2}


def test_early_stopping_needs_a_metric_and_evaluations(tmp_path, blocks):
    trainer = Trainer(
        trainer_model(), training_args(tmp_path), train_dataset=blocks, callbacks=[EarlyStoppingCallback()]
    )
    with pytest.raises(ValueError, match="metric_for_best_model"):
        trainer.train()
    trainer = Trainer(
        trainer_model(),
        training_args(tmp_path, metric_for_best_model="loss"),
        train_dataset=blocks,
        callbacks=[EarlyStoppingCallback()],
    )
    with pytest.raises(ValueError, match="eval_strategy"):
        trainer.train()
    with pytest.raises(ValueError, match="early_stopping_patience=0"):
        EarlyStoppingCallback(early_stopping_patience=0)


def test_stateful_callbacks_are_restored_only_when_asked(tmp_path, blocks):
    kw = dict(
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        metric_for_best_model="loss",
    )
    first = EarlyStoppingCallback(early_stopping_patience=5)
    Trainer(
        trainer_model(), training_args(tmp_path, **kw), train_dataset=blocks, eval_dataset=blocks[:4], callbacks=[first]
    ).train()
    assert first.early_stopping_patience_counter >= 0
    saved = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    counter = saved["stateful_callbacks"]["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"]

    class CounterAtStart(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.seen = cb.early_stopping_patience_counter

    for restore in (False, True):
        cb, start = EarlyStoppingCallback(early_stopping_patience=5), CounterAtStart()
        cb.early_stopping_patience_counter = 99
        args = training_args(tmp_path, restore_callback_states_from_checkpoint=restore, **kw)
        trainer = Trainer(trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:4], callbacks=[cb, start])
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
        assert start.seen == (counter if restore else 99)


def test_progress_bars_and_printer(tmp_path, blocks, capsys):
    args = training_args(tmp_path, max_steps=4, disable_tqdm=False, eval_strategy="steps", eval_steps=2)
    Trainer(trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:8]).train()
    captured = capsys.readouterr()
    assert "4/4" in captured.err and "1/1" in captured.err  # the training bar reached max_steps; an eval bar ran
    assert captured.out.count("'loss'") == 4  # logs are written through the bar (tqdm.write)
    Trainer(trainer_model(), training_args(tmp_path, max_steps=2), train_dataset=blocks).train()
    out = capsys.readouterr().out
    assert out.count("'loss'") == 2 and "'train_runtime'" in out and "total_flos" not in out


def test_jsonl_metrics_logger(tmp_path, blocks):
    args = training_args(tmp_path, max_steps=3, report_to="jsonl", eval_strategy="steps", eval_steps=3)
    trainer = Trainer(trainer_model(), args, train_dataset=blocks, eval_dataset=blocks[:4])
    assert any(isinstance(cb, JSONLinesCallback) for cb in trainer.callback_handler.callbacks)
    trainer.train()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3]
    assert lines[0]["loss"] == trainer.state.log_history[0]["loss"]
    assert any("eval_loss" in r for r in lines) and "train_runtime" in lines[-1]


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed (optional)")
def test_tensorboard_writes_event_files(tmp_path, blocks):
    Trainer(
        trainer_model(),
        training_args(tmp_path, max_steps=2, report_to="tensorboard", run_name="r"),
        train_dataset=blocks,
    ).train()
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "runs" / "r"))


@pytest.mark.skipif(HAS_TENSORBOARD, reason="checks the error raised when tensorboard is missing")
def test_report_to_tensorboard_without_tensorboard_raises(tmp_path):
    with pytest.raises(ValueError, match="report_to includes 'tensorboard' but the tensorboard package"):
        training_args(tmp_path, report_to="tensorboard")
    assert training_args(tmp_path, report_to="all").report_to == ["jsonl"]  # 'all' means what is installed


def test_trainer_state_json_round_trip_and_ratio_steps(tmp_path):
    state = TrainerState(global_step=7, best_metric=0.5, log_history=[{"loss": 1.0, "step": 1}])
    state.save_to_json(tmp_path / "s.json")
    assert TrainerState.load_from_json(tmp_path / "s.json") == state
    args = training_args(tmp_path, logging_steps=0.25, save_strategy="steps", save_steps=0.5)
    state.compute_steps(args, max_steps=10)
    assert (state.logging_steps, state.save_steps) == (3, 5)
