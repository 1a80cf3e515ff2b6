"""Reporting integrations chosen by ``report_to`` (transformers' ``integrations/integration_utils.py``):
TensorBoard when the package is installed, and hf-lite's JSON-lines metrics file, which needs nothing."""

from __future__ import annotations

import json
import os

from ..trainer_events import TrainerCallback


class JSONLinesCallback(TrainerCallback):
    """Appends every log as one JSON object (with ``step`` and ``epoch``) to ``output_dir/metrics.jsonl`` on the
    main process; each line is flushed, so a crash loses at most the line being written."""

    file_name = "metrics.jsonl"

    def __init__(self, path: str | None = None):
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        if self.path is None:
            self.path = os.path.join(args.output_dir, self.file_name)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or logs is None:
            return
        path = self.path or os.path.join(args.output_dir, self.file_name)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        record = {"step": state.global_step, **{k: v for k, v in logs.items() if _is_json_scalar(v)}}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()


def _is_json_scalar(value) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


class TensorBoardCallback(TrainerCallback):
    """Writes scalars under ``output_dir/runs/<run_name>`` with ``torch.utils.tensorboard`` (needs tensorboard)."""

    def __init__(self, tb_writer=None):
        try:
            from torch.utils.tensorboard import SummaryWriter  # imports the tensorboard package
        except ImportError as err:
            raise RuntimeError(
                "TensorBoardCallback requires tensorboard to be installed (pip install tensorboard)"
            ) from err
        self._summary_writer_cls = SummaryWriter
        self.tb_writer = tb_writer

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.tb_writer is None:
            log_dir = os.path.join(args.output_dir, "runs", args.run_name or "hf_lite")
            self.tb_writer = self._summary_writer_cls(log_dir=log_dir)
            self.tb_writer.add_text("args", args.to_json_string())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.tb_writer is None:
            return
        for k, v in (logs or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.tb_writer.add_scalar(
                    k if "/" in k or k.startswith("eval_") else f"train/{k}", v, state.global_step
                )
        self.tb_writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.tb_writer is not None:
            self.tb_writer.close()
            self.tb_writer = None


INTEGRATION_TO_CALLBACK = {"tensorboard": TensorBoardCallback, "jsonl": JSONLinesCallback}


def get_reporting_integration_callbacks(report_to: list[str]) -> list[type[TrainerCallback]]:
    """Callback classes for ``TrainingArguments.report_to`` (already checked against what is installed)."""
    unknown = [name for name in report_to if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        raise ValueError(
            f"report_to={report_to!r}: unknown integration(s) {unknown}; supported: {sorted(INTEGRATION_TO_CALLBACK)}"
        )
    return [INTEGRATION_TO_CALLBACK[name] for name in report_to]
