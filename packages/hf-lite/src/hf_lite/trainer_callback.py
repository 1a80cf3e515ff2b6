"""``hf_lite.trainer_callback`` (transformers' ``trainer_callback.py``): the state, control switches, events and flow
decisions are the core's (``trainer_events.py``); the progress, printer and early-stopping callbacks are in
``_compat/trainer_callbacks.py``."""

from ._compat.trainer_callbacks import EarlyStoppingCallback, PrinterCallback, ProgressCallback
from .trainer_events import (
    EVENTS,
    CallbackHandler,
    DefaultFlowCallback,
    ExportableState,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from .trainer_utils import IntervalStrategy, SaveStrategy, has_length

__all__ = [
    "EVENTS",
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "ExportableState",
    "IntervalStrategy",
    "PrinterCallback",
    "ProgressCallback",
    "SaveStrategy",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "has_length",
]
