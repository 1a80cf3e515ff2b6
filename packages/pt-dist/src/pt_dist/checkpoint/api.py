"""``CheckpointException`` (torch/distributed/checkpoint/api.py): what every rank raises when any rank's step of
a save or load failed; ``failures`` maps each failed rank to its (exception, traceback)."""

from __future__ import annotations

import pickle
import traceback

__all__ = ["CheckpointException"]


def _wrap_exception(exc: BaseException):
    """(exception, its traceback's frames) in a form that survives pickling to the other ranks."""
    trace = traceback.extract_tb(exc.__traceback__)
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        exc = RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc, trace


class CheckpointException(BaseException):
    def __init__(self, msg: str, failures: dict):
        super().__init__(msg, failures)
        self._failures = failures

    @property
    def failures(self) -> dict:
        return self._failures

    def __str__(self) -> str:
        text = f"CheckpointException ranks:{self._failures.keys()}\n"
        for rank, (exc, trace) in self._failures.items():
            text += f"Traceback (most recent call last): (RANK {rank})\n"
            if trace is not None:
                text += "".join(traceback.format_list(trace))
            text += "".join(traceback.format_exception_only(type(exc), exc))
        return text
