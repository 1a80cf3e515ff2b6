"""ds_zero: DeepSpeed's ZeRO engine rebuilt small (stages 1-3, fp16/bf16, DeepSpeed JSON config, checkpoints)."""

from __future__ import annotations

from ds_zero import zero
from ds_zero.config import DeepSpeedConfig, DeepSpeedConfigError
from ds_zero.engine import DeepSpeedEngine

__version__ = "0.1.0"

__all__ = ["initialize", "DeepSpeedEngine", "DeepSpeedConfig", "DeepSpeedConfigError", "zero"]


def initialize(model, config=None, model_parameters=None, optimizer=None, lr_scheduler=None, training_data=None,
               collate_fn=None, mpu=None, dist_init_required=None, config_params=None, args=None):
    """Wrap ``model`` for ZeRO training; returns ``(engine, optimizer, training_dataloader, lr_scheduler)``.

    Same signature and return value as ``deepspeed.initialize``; ``config`` is a dict or a JSON path
    (``config_params`` is DeepSpeed's older name for it).
    """
    if config is None:
        config = config_params if config_params is not None else getattr(args, "deepspeed_config", None)
    if config is None:
        raise ValueError("initialize needs a config: a dict or the path of a DeepSpeed JSON file")
    engine = DeepSpeedEngine(model, config, model_parameters=model_parameters, optimizer=optimizer,
                             lr_scheduler=lr_scheduler, training_data=training_data, collate_fn=collate_fn, mpu=mpu,
                             dist_init_required=dist_init_required)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
