"""The rest of transformers' ``optimization.py`` schedules, as ``LambdaLR`` factors like the core ones
(``optimization.py``): polynomial decay, inverse square root, cosine with hard restarts, cosine down to a minimum.
Scripts build them directly; ``TrainingArguments.lr_scheduler_type`` names the core four."""

from __future__ import annotations

import math
from functools import partial

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def _warmup(step: int, num_warmup_steps: int) -> float:
    return float(step) / float(max(1, num_warmup_steps))


def _progress(step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    return float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))


def _polynomial(step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float,
                lr_init: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init
    remaining = 1 - (step - num_warmup_steps) / (num_training_steps - num_warmup_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def get_polynomial_decay_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, lr_end=1e-7, power=1.0,
                                              last_epoch=-1):
    """Linear warmup, then from the optimizer's lr down to ``lr_end`` as ``(1 - progress) ** power``."""
    lr_init = optimizer.defaults["lr"]
    if not lr_init > lr_end:
        raise ValueError(f"lr_end ({lr_end}) must be smaller than initial lr ({lr_init})")
    fn = partial(_polynomial, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 lr_end=lr_end, power=power, lr_init=lr_init)
    return LambdaLR(optimizer, fn, last_epoch)


def _inverse_sqrt(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return 1.0 / math.sqrt((step + timescale - num_warmup_steps) / timescale)


def get_inverse_sqrt_schedule(optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None,
                              last_epoch: int = -1):
    """Linear warmup, then ``1 / sqrt((step + timescale - warmup) / timescale)`` (default timescale: the warmup,
    else 10,000)."""
    timescale = timescale if timescale is not None else (num_warmup_steps or 10_000)
    return LambdaLR(optimizer, partial(_inverse_sqrt, num_warmup_steps=num_warmup_steps, timescale=timescale),
                    last_epoch=last_epoch)


def _hard_restarts(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = _progress(step, num_warmup_steps, num_training_steps)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def get_cosine_with_hard_restarts_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int,
                                                       num_training_steps: int, num_cycles: int = 1,
                                                       last_epoch: int = -1):
    """Linear warmup, then ``num_cycles`` cosine decays from the initial lr to 0, each restarting at the top."""
    fn = partial(_hard_restarts, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 num_cycles=num_cycles)
    return LambdaLR(optimizer, fn, last_epoch)


def _cosine_to_min(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float,
                   min_lr_rate: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * _progress(step, num_warmup_steps,
                                                                                  num_training_steps)))
    return max(0, cosine * (1 - min_lr_rate) + min_lr_rate)


def get_cosine_with_min_lr_schedule_with_warmup(optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int,
                                                num_cycles: float = 0.5, last_epoch: int = -1,
                                                min_lr: float | None = None, min_lr_rate: float | None = None):
    """The cosine schedule ending at ``min_lr`` (or ``min_lr_rate`` times the initial lr) instead of 0."""
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError("Only one of min_lr or min_lr_rate should be set")
    if min_lr is not None:
        min_lr_rate = min_lr / optimizer.defaults["lr"]
    elif min_lr_rate is None:
        raise ValueError("One of min_lr or min_lr_rate should be set through the `lr_scheduler_kwargs`")
    fn = partial(_cosine_to_min, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 num_cycles=num_cycles, min_lr_rate=min_lr_rate)
    return LambdaLR(optimizer, fn, last_epoch)
