"""Loss scaling for fp16 training (Micikevicius et al., "Mixed Precision Training", 2018, section 3.2).

ZeRO stages 1-3 use DeepSpeed's ``DynamicLossScaler`` (``deepspeed/runtime/fp16/loss_scaler.py``): on
overflow the step is skipped and the scale is divided by 2 once ``hysteresis`` overflows have been
absorbed; after ``scale_window`` clean steps since the last overflow it doubles. Stage 0 uses the
fp16 optimizer's simpler rule (:class:`FP16OptimizerLossScaler`).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


class LossScaler:
    """A static loss scale (``fp16.loss_scale > 0``, or 1.0 for fp32/bf16)."""

    dynamic = False

    def __init__(self, scale: float = 1.0):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        return None

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, sd: dict) -> None:
        self.cur_scale = sd["cur_scale"]


class DynamicLossScaler(LossScaler):
    dynamic = True

    def __init__(self, init_scale: float = 2.0**16, scale_window: int = 1000, min_scale: float = 1.0,
                 delayed_shift: int = 2, consecutive_hysteresis: bool = False, scale_factor: float = 2.0):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise RuntimeError(f"loss scale already at its minimum {self.min_scale}; gradients keep "
                                       "overflowing (raise fp16.min_loss_scale or fix the model)")
                new = max(self.cur_scale / self.scale_factor, self.min_scale)
                logger.info("fp16 overflow: skipping step, loss scale %s -> %s", self.cur_scale, new)
                self.cur_scale = new
            else:
                logger.info("fp16 overflow: skipping step, hysteresis %d -> %d", self.cur_hysteresis,
                            self.cur_hysteresis - 1)
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            clean = self.cur_iter - self.last_overflow_iter - 1
            if clean > 0 and clean % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")}

    def load_state_dict(self, sd: dict) -> None:
        for k, v in sd.items():
            setattr(self, k, v)


class FP16OptimizerLossScaler(DynamicLossScaler):
    """Stage 0's rule (DeepSpeed's ``FP16_Optimizer._update_scale``): every overflow halves the scale, clamped at
    ``min_scale`` (no hysteresis, never an error); ``scale_window`` clean steps double it."""

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            new = max(self.cur_scale / self.scale_factor, self.min_scale)
            logger.info("fp16 overflow: skipping step, loss scale %s -> %s", self.cur_scale, new)
            self.cur_scale = new
            self.last_overflow_iter = self.cur_iter
        else:
            clean = self.cur_iter - self.last_overflow_iter - 1
            if clean > 0 and clean % self.scale_window == 0:
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


def has_overflow(tensors, groups=(None,), device=None) -> bool:
    """Whether any rank saw inf/NaN: one MAX all-reduce per group (data, then model parallel) so every rank
    skips the same step. ``groups`` empty: this rank's tensors only."""
    tensors = [t for t in tensors if t is not None]
    # On the communication device: nccl cannot reduce a CPU tensor.
    if device is None:
        device = tensors[0].device if tensors else None
    flag = torch.zeros(1, dtype=torch.float32, device=device)
    for t in tensors:
        if t.numel() and not torch.isfinite(t).all():
            flag.fill_(1.0)
            break
    if torch.distributed.is_initialized():
        for group in groups:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
    return bool(flag.item())


def create_loss_scaler(fp16_config, stage: int = 1) -> LossScaler:
    if not fp16_config.enabled:
        return LossScaler(1.0)
    if fp16_config.loss_scale > 0:
        return LossScaler(fp16_config.loss_scale)
    cls = FP16OptimizerLossScaler if stage == 0 else DynamicLossScaler
    return cls(init_scale=2.0**fp16_config.initial_scale_power, scale_window=fp16_config.loss_scale_window,
               min_scale=fp16_config.min_loss_scale, delayed_shift=fp16_config.hysteresis,
               consecutive_hysteresis=fp16_config.consecutive_hysteresis)
