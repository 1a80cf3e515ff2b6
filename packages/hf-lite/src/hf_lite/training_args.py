"""``hf_lite.training_args`` (transformers' ``training_args.py``): ``TrainingArguments``, transformers' field names,
defaults, aliases and checks, in ``_compat/training_args.py``; the core loop (``trainer_loop.py``) reads its fields."""

from ._compat.training_args import HubStrategy, ParallelMode, TrainingArguments
from .trainer_utils import ExplicitEnum, IntervalStrategy, OptimizerNames, SaveStrategy, SchedulerType

__all__ = ["ExplicitEnum", "HubStrategy", "IntervalStrategy", "OptimizerNames", "ParallelMode", "SaveStrategy",
           "SchedulerType", "TrainingArguments"]
