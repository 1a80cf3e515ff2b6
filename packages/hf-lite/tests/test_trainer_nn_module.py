"""The Trainer on a plain ``torch.nn.Module`` (no config, no ``floating_point_ops``), side by side with
transformers' Trainer: the same losses, checkpoints and ``trainer_state.json``; and evaluation results as numpy.

Mirrors transformers' tests/trainer/test_trainer.py (its ``RegressionModel`` / ``RegressionDataset`` cases:
test_trainer_works_with_dict, test_model_output, test_predict, test_evaluate with variable-length outputs),
rewritten with this file's own regression model. transformers' Trainer needs ``accelerate`` (the dev group)."""

import json
import os

import numpy as np
import pytest
import torch
from hf_lite import Trainer, TrainingArguments
from hf_lite.modeling_outputs import ModelOutput
from safetensors.torch import load_file
from torch import nn


class RegressionDataset:
    """y = a * x + b + noise, as transformers' ``RegressionDataset``."""

    def __init__(self, a=2.0, b=3.0, length=64, seed=42):
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(length,)).astype(np.float32)
        self.y = (a * self.x + b + rng.normal(scale=0.1, size=(length,))).astype(np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_x": self.x[i], "labels": self.y[i]}


class RegressionModel(nn.Module):
    """A plain module whose forward returns (loss, y) with labels, (y,) without; ``output`` picks dict/ModelOutput."""

    def __init__(self, a=0.0, b=0.0, output="tuple"):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))
        self.b = nn.Parameter(torch.tensor(b))
        self.output = output

    def forward(self, input_x, labels=None, **kwargs):
        y = input_x * self.a + self.b
        loss = None if labels is None else nn.functional.mse_loss(y, labels)
        if self.output == "dict":
            return {"loss": loss, "logits": y} if loss is not None else {"logits": y}
        if self.output == "model_output":
            return ModelOutput(loss=loss, logits=y)
        return (y,) if loss is None else (loss, y)


class VariableLengthModel(nn.Module):
    """Predicts one row of ``n`` values per example, ``n`` set per batch: predictions of different lengths."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.5))

    def forward(self, input_x, labels=None):
        n = 2 + int(input_x.shape[0] % 3)
        y = (input_x * self.a)[:, None].expand(-1, n).contiguous()
        if labels is None:
            return (y,)
        return (nn.functional.mse_loss(y[:, 0], labels), y)


COMMON = dict(
    per_device_train_batch_size=8,
    num_train_epochs=2,
    learning_rate=0.1,
    logging_steps=1,
    save_steps=5,
    eval_strategy="steps",
    eval_steps=4,
    report_to="none",
    seed=5,
    disable_tqdm=True,
    optim="adamw_torch",
    use_cpu=True,
)


def _run_both(tmp_path, output="tuple", **kw):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer requires accelerate (the dev group has it)")
    args = {**COMMON, **kw}
    train, evalset = RegressionDataset(), RegressionDataset(length=20, seed=1)
    theirs = transformers.Trainer(
        model=RegressionModel(output=output),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "t"), **args),
        train_dataset=train,
        eval_dataset=evalset,
    )
    theirs.train()
    ours = Trainer(
        RegressionModel(output=output),
        TrainingArguments(output_dir=str(tmp_path / "o"), **args),
        train_dataset=train,
        eval_dataset=evalset,
    )
    ours.train()
    return theirs, ours


def _history(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


@pytest.mark.parametrize("output", ["tuple", "dict", "model_output"])
def test_plain_module_trains_as_transformers_trainer_does(tmp_path, output):
    theirs, ours = _run_both(tmp_path, output=output)
    assert ours.state.global_step == theirs.state.global_step == 16
    for key in ("loss", "grad_norm", "learning_rate", "eval_loss"):
        assert _history(ours, key) == pytest.approx(_history(theirs, key), rel=1e-5, abs=1e-7), key
    for name, p in theirs.model.named_parameters():
        torch.testing.assert_close(dict(ours.model.named_parameters())[name], p, rtol=1e-6, atol=1e-6)
    assert ours.state.total_flos == theirs.state.total_flos == 0  # a plain module counts no FLOPs


def test_plain_module_checkpoints_match_transformers(tmp_path):
    theirs, ours = _run_both(tmp_path)
    t_ckpts = sorted(os.listdir(tmp_path / "t"))
    assert sorted(os.listdir(tmp_path / "o")) == t_ckpts
    assert t_ckpts == ["checkpoint-10", "checkpoint-15", "checkpoint-16", "checkpoint-5"]
    for ckpt in t_ckpts:
        t_dir, o_dir = tmp_path / "t" / ckpt, tmp_path / "o" / ckpt
        t_weights, o_weights = load_file(t_dir / "model.safetensors"), load_file(o_dir / "model.safetensors")
        assert t_weights.keys() == o_weights.keys()
        for k in t_weights:
            torch.testing.assert_close(o_weights[k], t_weights[k], rtol=1e-6, atol=1e-6)
        t_state = json.loads((t_dir / "trainer_state.json").read_text())
        o_state = json.loads((o_dir / "trainer_state.json").read_text())
        assert set(o_state) >= set(t_state)
        for key in ("global_step", "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps",
                    "train_batch_size", "total_flos", "best_metric", "best_model_checkpoint"):
            assert o_state[key] == t_state[key], key
        assert o_state["epoch"] == pytest.approx(t_state["epoch"])
        assert [sorted(h) for h in o_state["log_history"]] == [sorted(h) for h in t_state["log_history"]]
    # resuming ours from its checkpoint goes on to the same parameters
    resumed = Trainer(
        RegressionModel(),
        TrainingArguments(output_dir=str(tmp_path / "o"), **COMMON),
        train_dataset=RegressionDataset(),
        eval_dataset=RegressionDataset(length=20, seed=1),
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "o" / "checkpoint-10"))
    for name, p in theirs.model.named_parameters():
        torch.testing.assert_close(dict(resumed.model.named_parameters())[name], p, rtol=1e-6, atol=1e-6)


def test_predict_and_compute_metrics_get_numpy_padded_with_minus_100(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers' Trainer requires accelerate (the dev group has it)")
    seen = {}

    def compute_metrics(p):
        seen.setdefault("types", []).append((type(p.predictions), type(p.label_ids)))
        return {"mean_prediction": p.predictions[p.predictions != -100].mean()}

    data = RegressionDataset(length=10)  # batches of 4, 4 and 2: rows of 3, 3 and 4 values
    results = []
    for lib, out in ((transformers, "t"), (None, "o")):
        trainer_cls, args_cls = (lib.Trainer, lib.TrainingArguments) if lib else (Trainer, TrainingArguments)
        args = args_cls(output_dir=str(tmp_path / out), per_device_eval_batch_size=4, report_to="none", use_cpu=True)
        trainer = trainer_cls(model=VariableLengthModel(), args=args, compute_metrics=compute_metrics)
        results.append((trainer.predict(data), trainer.evaluate(data)))
    (t_pred, t_eval), (o_pred, o_eval) = results
    assert isinstance(o_pred.predictions, np.ndarray) and isinstance(o_pred.label_ids, np.ndarray)
    assert seen["types"][2:] == seen["types"][:2] == [(np.ndarray, np.ndarray)] * 2
    assert o_pred.predictions.shape == t_pred.predictions.shape == (10, 4)
    np.testing.assert_array_equal(o_pred.predictions, t_pred.predictions)  # -100 where a row was shorter
    np.testing.assert_array_equal(o_pred.label_ids, t_pred.label_ids)
    assert o_pred.predictions.dtype == t_pred.predictions.dtype
    assert o_eval["eval_mean_prediction"] == pytest.approx(t_eval["eval_mean_prediction"], rel=1e-6)
    assert o_eval["eval_loss"] == pytest.approx(t_eval["eval_loss"], rel=1e-6)
    assert o_pred.metrics["test_loss"] == pytest.approx(t_pred.metrics["test_loss"], rel=1e-6)
