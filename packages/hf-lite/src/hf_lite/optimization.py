"""Learning-rate schedules as multiplicative ``LambdaLR`` factors (transformers' ``optimization.py``), and the
weight-decay split of ``Trainer.get_decay_parameter_names``."""

from __future__ import annotations

import math
import re
from functools import partial

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from .trainer_utils import SchedulerType


def _constant(_: int) -> float:
    return 1.0


def _constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _linear_with_warmup(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine_with_warmup(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


# Module-level functions through functools.partial (not closures), so a scheduler's state_dict pickles.
def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    return LambdaLR(optimizer, _constant, last_epoch=last_epoch)


def get_constant_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    return LambdaLR(optimizer, partial(_constant_with_warmup, num_warmup_steps=num_warmup_steps), last_epoch=last_epoch)


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1):
    fn = partial(_linear_with_warmup, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)
    return LambdaLR(optimizer, fn, last_epoch=last_epoch)


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5,
                                    last_epoch: int = -1):
    fn = partial(_cosine_with_warmup, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 num_cycles=num_cycles)
    return LambdaLR(optimizer, fn, last_epoch=last_epoch)


TYPE_TO_SCHEDULER_FUNCTION = {SchedulerType.LINEAR: get_linear_schedule_with_warmup,
                              SchedulerType.COSINE: get_cosine_schedule_with_warmup,
                              SchedulerType.CONSTANT: get_constant_schedule,
                              SchedulerType.CONSTANT_WITH_WARMUP: get_constant_schedule_with_warmup}


def get_scheduler(name, optimizer, num_warmup_steps=None, num_training_steps=None, scheduler_specific_kwargs=None):
    """A schedule by ``SchedulerType`` name; ``scheduler_specific_kwargs`` (``lr_scheduler_kwargs``) go to it."""
    name = SchedulerType(name)
    kwargs = dict(scheduler_specific_kwargs or {})
    if name == SchedulerType.CONSTANT:
        if kwargs:
            raise TypeError(f"lr_scheduler_type='constant' takes no lr_scheduler_kwargs, got {sorted(kwargs)}")
        return get_constant_schedule(optimizer)
    if num_warmup_steps is None:
        raise ValueError(f"{name.value} requires `num_warmup_steps`, please provide that argument.")
    if name == SchedulerType.CONSTANT_WITH_WARMUP:
        if kwargs:
            raise TypeError(f"lr_scheduler_type='{name.value}' takes no lr_scheduler_kwargs, got {sorted(kwargs)}")
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=num_warmup_steps)
    if num_training_steps is None:
        raise ValueError(f"{name.value} requires `num_training_steps`, please provide that argument.")
    allowed = {"num_cycles"} if name == SchedulerType.COSINE else set()
    if set(kwargs) - allowed:
        unexpected = sorted(set(kwargs) - allowed)
        raise TypeError(f"lr_scheduler_type='{name.value}' got unexpected lr_scheduler_kwargs {unexpected}")
    return TYPE_TO_SCHEDULER_FUNCTION[name](optimizer, num_warmup_steps=num_warmup_steps,
                                            num_training_steps=num_training_steps, **kwargs)


# transformers' ALL_LAYERNORM_LAYERS plus these name patterns: biases and every kind of norm weight get no decay.
FORBIDDEN_NAME_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def get_parameter_names(model: nn.Module, forbidden_layer_types, forbidden_layer_names=None) -> list[str]:
    """Names of parameters not inside a forbidden layer type and not matching a forbidden (lowercased) pattern."""
    patterns = [re.compile(p) for p in (forbidden_layer_names or [])]
    result = []
    for name, child in model.named_children():
        for n in get_parameter_names(child, forbidden_layer_types, forbidden_layer_names):
            full = f"{name}.{n}"
            inside_forbidden = isinstance(child, tuple(forbidden_layer_types))
            if not inside_forbidden and not any(p.search(full.lower()) for p in patterns):
                result.append(full)
    result += [k for k in model._parameters if not any(p.search(k.lower()) for p in patterns)]
    return result


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """The parameters weight decay applies to (``Trainer.get_decay_parameter_names``)."""
    return get_parameter_names(model, [nn.LayerNorm], FORBIDDEN_NAME_PATTERNS)
