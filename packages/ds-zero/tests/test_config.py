"""The DeepSpeed config subset: batch-size triangle, defaults, and clear errors naming key and allowed values."""

import json

import pytest
from ds_zero.config import DeepSpeedConfig, DeepSpeedConfigError


def load(cfg, world=2):
    return DeepSpeedConfig.load(cfg, world)


@pytest.mark.parametrize(("given", "expect"), [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, (32, 4, 4)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, (32, 8, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}, (24, 4, 3)),
    ({"train_batch_size": 16}, (16, 8, 1)),
    ({"train_micro_batch_size_per_gpu": 5}, (10, 5, 1)),
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}, (16, 2, 4)),
])
def test_batch_triangle(given, expect):
    cfg = load(given)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == expect


@pytest.mark.parametrize(("given", "message"), [
    ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3},
     "train_batch_size=16 is not equal to"),
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, "not divisible"),
    ({}, "train_batch_size"),
    ({"train_batch_size": 0}, "'train_batch_size' has invalid value 0"),
    ({"train_batch_size": 8, "zero_optimisation": {}}, "unknown config key 'zero_optimisation'"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, r"'zero_optimization.stage' has invalid value 4; "
                                                                  r"allowed: \[0, 1, 2, 3\]"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "bucket": 1}}, "unknown config key 'bucket'"),
    ({"train_batch_size": 8, "zero_optimization": {"overlap_comm": "yes"}}, "overlap_comm.*true or false"),
    ({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
     r"offload_optimizer.device' has invalid value 'nvme'; allowed: \['none', 'cpu'\]"),
    ({"train_batch_size": 8, "optimizer": {"type": "Lamb"}}, r"optimizer.type.*'Lamb'.*\['Adam', 'AdamW', 'SGD'\]"),
    ({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"momentum": 0.9}}},
     "unknown config key 'momentum' in 'optimizer.params'"),
    ({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}}, "betas"),
    ({"train_batch_size": 8, "scheduler": {"type": "OneCycle"}}, "scheduler.type.*WarmupCosineLR"),
    ({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {}}}, "total_num_steps"),
    ({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}},
     r"warmup_type.*\['linear', 'log'\]"),
    ({"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "enable at most one"),
    ({"train_batch_size": 8, "fp16": {"enabled": True, "hysteresis": 0}}, "fp16.hysteresis"),
    ({"train_batch_size": 8, "gradient_clipping": -1}, "gradient_clipping"),
])
def test_bad_config_names_key_and_allowed_values(given, message):
    with pytest.raises(DeepSpeedConfigError, match=message):
        load(given)


def test_defaults_and_json_path(tmp_path):
    raw = {"train_batch_size": 8, "fp16": {"enabled": True}, "optimizer": {"type": "adamw", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": 3}, "steps_per_print": 10}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(raw))
    cfg = load(str(path))
    assert cfg.optimizer_name == "AdamW" and cfg.optimizer_params == {"lr": 0.1}
    assert cfg.fp16.enabled and cfg.fp16.initial_scale_power == 16 and cfg.fp16.hysteresis == 2
    assert cfg.zero.stage == 3 and cfg.zero.stage3_param_persistence_threshold == 100_000
    assert cfg.zero.reduce_bucket_size == 500_000_000 and not cfg.zero.overlap_comm
    with pytest.raises(DeepSpeedConfigError, match="does not exist"):
        load(str(tmp_path / "missing.json"))


def test_engine_rejects_bad_config_before_any_communication():
    """torch.distributed is not even initialised here: validation must come first."""
    import ds_zero
    import torch

    with pytest.raises(DeepSpeedConfigError, match="zero_optimization.stage"):
        ds_zero.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 2,
                                                                "zero_optimization": {"stage": 9}})
