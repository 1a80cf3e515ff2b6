"""The DeepSpeed config subset: batch-size triangle, defaults, clear errors naming key and allowed values,
unknown keys refused where DeepSpeed refuses them and logged and ignored elsewhere, the legacy spellings
(``"bfloat16"``, ``"zero_optimization": true``) read as DeepSpeed reads them. Also DeepSpeed's
tests/unit/runtime/zero/test_zero_config.py, ported."""

import json
import logging

import pytest
from ds_zero.config import DeepSpeedConfig, DeepSpeedConfigError
from ds_zero.runtime.zero.config import parse_zero_config


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
    ({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, r"'zero_optimization.stage' has invalid value 4; "
                                                                  r"allowed: \[0, 1, 2, 3\]"),
    ({"train_batch_size": 8, "zero_optimization": {"overlap_comm": "yes"}}, "overlap_comm.*true or false"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "disk"}}},
     r"offload_optimizer.device' has invalid value 'disk'; allowed: \['none', 'cpu', 'nvme'\]"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}},
     "offload_optimizer.nvme_path' has invalid value None"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
                                                                                     "nvme_path": "/tmp"}}},
     "offload_optimizer.device' has invalid value 'nvme'.*stage is 3"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
     "unless zero_optimization.stage is 1, 2 or 3"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
     "offload_param.device.*unless zero_optimization.stage is 3"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
     "ratio"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1}},
     "stage3_prefetch_bucket_size' has invalid value -1; allowed: an integer >= 0"),
    ({"train_batch_size": 8, "zero_optimization": {"sub_group_size": 0}}, "sub_group_size"),
    ({"train_batch_size": 8, "activation_checkpointing": {"contiguous_memory_optimization": True}},
     "number_checkpoints"),
    ({"train_batch_size": 8, "aio": {"block_size": 1000}}, "aio.block_size.*4096"),
    ({"train_batch_size": 8, "pipeline": {"stages": 0}}, "pipeline.stages"),
    ({"train_batch_size": 8, "optimizer": {"type": "Lamb"}}, r"optimizer.type.*'Lamb'.*\['Adam', 'AdamW', 'SGD'\]"),
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
    assert cfg.zero.reduce_bucket_size == 500_000_000 and cfg.zero.overlap_comm  # DeepSpeed: on at stage 3
    with pytest.raises(DeepSpeedConfigError, match="does not exist"):
        load(str(tmp_path / "missing.json"))


def test_engine_rejects_bad_config_before_any_communication():
    """torch.distributed is not even initialised here: validation must come first."""
    import ds_zero
    import torch

    with pytest.raises(DeepSpeedConfigError, match="zero_optimization.stage"):
        ds_zero.initialize(model=torch.nn.Linear(2, 2), config={"train_batch_size": 2,
                                                                "zero_optimization": {"stage": 9}})


def test_unknown_keys_warn_and_are_ignored(caplog):
    """DeepSpeed ignores unknown top-level keys; a config written for another DeepSpeed still runs here."""
    with caplog.at_level(logging.WARNING, logger="ds_zero.config"):
        cfg = load({"train_batch_size": 8, "zero_optimisation": {}, "wall_clock_breakdown": True,
                    "zero_optimization": {"stage": 2, "round_robin_gradients": True},
                    "optimizer": {"type": "Adam", "params": {"lr": 0.1, "momentum": 0.9}}})
    text = caplog.text
    assert "unknown config key 'zero_optimisation' at the top level" in text
    assert "unknown config key 'momentum' in 'optimizer.params'" in text
    assert "'round_robin_gradients' in 'zero_optimization' is a DeepSpeed option ds_zero does not implement" in text
    assert "'wall_clock_breakdown' at the top level is a DeepSpeed option" in text
    assert cfg.zero.stage == 2 and cfg.optimizer_params == {"lr": 0.1}


# Sections DeepSpeed validates with pydantic (extra="forbid") refuse a key they do not know; the others ignore it.
SECTION_CASES = {
    "zero typo": ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sz": 10}}, "stage3_prefetch_bucket_sz"),
    "offload_param": ({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "bogus": 1}}}, "bogus"),
    "offload_optimizer": ({"zero_optimization": {"stage": 2, "offload_optimizer": {"bogus": 1}}}, "bogus"),
    "fp16": ({"fp16": {"enabled": False, "loss_scal": 0}}, "loss_scal"),
    "bf16": ({"bf16": {"enabled": False, "enable": True}}, "enable"),
    "bfloat16": ({"bfloat16": {"enabled": False, "enable": True}}, "enable"),
    "top level": ({"bogus_top": 1}, None),
    "activation_checkpointing": ({"activation_checkpointing": {"bogus": 1}}, None),
    "aio": ({"aio": {"bogus": 1}}, None),
    "pipeline": ({"pipeline": {"bogus": 1}}, None),
}


def _deepspeed_refuses(cfg) -> bool:
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    try:
        ds_config.DeepSpeedConfig(cfg, mpu=None)
    except Exception as e:  # pydantic's ValidationError
        assert "Extra inputs are not permitted" in str(e)
        return True
    return False


@pytest.mark.parametrize("case", list(SECTION_CASES))
def test_unknown_keys_refused_where_deepspeed_refuses_them(case):
    extra, bad_key = SECTION_CASES[case]
    cfg = {"train_batch_size": 2, **extra}
    assert _deepspeed_refuses(cfg) == (bad_key is not None)
    if bad_key is None:
        load(cfg)
        return
    with pytest.raises(DeepSpeedConfigError, match=rf"unknown config key '{bad_key}' in '.*'; allowed: \["):
        load(cfg)


@pytest.mark.parametrize(("extra", "stage", "allgather"), [
    ({"zero_optimization": True}, 1, 500_000_000),
    ({"zero_optimization": True, "allgather_size": 1000}, 1, 1000),
    ({"zero_optimization": False}, 0, 500_000_000),
])
def test_legacy_boolean_zero_optimization_is_stage_1_as_in_deepspeed(extra, stage, allgather):
    """DeepSpeed's getting-started page sets "zero_optimization": true (read_zero_config_deprecated)."""
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    theirs = ds_config.DeepSpeedConfig({"train_batch_size": 2, **extra}, mpu=None)
    ours = load({"train_batch_size": 2, **extra})
    assert ours.zero.stage == theirs.zero_optimization_stage == stage
    assert ours.zero.allgather_bucket_size == theirs.zero_config.allgather_bucket_size == allgather


@pytest.mark.parametrize(("extra", "enabled"), [
    ({"bfloat16": {"enabled": True}}, True),
    ({"bf16": {"enabled": True}, "bfloat16": {"enabled": False}}, True),
    ({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}, False),
])
def test_bfloat16_section_is_read_as_bf16(extra, enabled):
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    theirs = ds_config.DeepSpeedConfig({"train_batch_size": 2, **extra}, mpu=None)
    assert load({"train_batch_size": 2, **extra}).bf16_enabled == theirs.bfloat16_config.enabled == enabled


def test_values_deepspeed_accepts():
    """Issue 27 item 6: 0 means "no prefetch" / "release at once" in DeepSpeed; sub_group_size is its tile size."""
    z = parse_zero_config({"stage": 3, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0,
                           "sub_group_size": 1000, "stage3_max_live_parameters": 0,
                           "offload_param": {"device": "cpu", "pin_memory": False},
                           "offload_optimizer": {"device": "cpu", "pin_memory": False}})
    assert (z.prefetch_bucket_size, z.max_reuse_distance, z.sub_group_size, z.max_live_parameters) == (0, 0, 1000, 0)
    assert z.offload_param.device == "cpu" and z.offload_param.pin_memory is False
    assert z.offload_optimizer.pin_memory is False and z.offload_optimizer.buffer_count == 4


def test_nvme_path_checked_at_start_up(tmp_path):
    """An unwritable swap directory is a config error, not a failure at the first swap-out."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        import os

        if os.access(ro, os.W_OK):  # running as root: permissions do not bind, use a path under a file instead
            ro = tmp_path / "file"
            ro.write_text("x")
            ro = ro / "sub"
        with pytest.raises(DeepSpeedConfigError, match="offload_optimizer.nvme_path"):
            parse_zero_config({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(ro)}})
    finally:
        (tmp_path / "ro").chmod(0o700)
    z = parse_zero_config({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "ok")}})
    assert z.offload_optimizer.nvme_path == str(tmp_path / "ok") and (tmp_path / "ok").is_dir()


# --- DeepSpeed's tests/unit/runtime/zero/test_zero_config.py -------------------------------------
def test_zero_config_aliasfields():
    assert parse_zero_config({"stage3_prefetch_bucket_size": 12345}).prefetch_bucket_size == 12345
    assert parse_zero_config({"stage3_param_persistence_threshold": 12345}).param_persistence_threshold == 12345
    assert parse_zero_config({"stage3_max_reuse_distance": 12345}).max_reuse_distance == 12345
    assert parse_zero_config({"prefetch_bucket_size": 7}).stage3_prefetch_bucket_size == 7


def test_zero_config_overlapcomm():
    for stage in [0, 1, 2]:
        assert parse_zero_config({"stage": stage}).overlap_comm is False
    assert parse_zero_config({"stage": 3}).overlap_comm is True


def test_zero_config_offload_configs():
    z = parse_zero_config({})
    assert not z.offload_param.enabled and not z.offload_optimizer.enabled
    z = parse_zero_config({"stage": 3, "offload_param": None, "offload_optimizer": None})
    assert not z.offload_param.enabled and not z.offload_optimizer.enabled
    z = parse_zero_config({"stage": 3, "offload_param": {}, "offload_optimizer": {}})
    assert z.offload_param.device == "none" and z.offload_param.buffer_count == 5


def test_zero_offload_optimizer_config_pipeline():
    assert parse_zero_config({"stage": 3, "offload_optimizer": {}}).offload_optimizer.pipeline is False
    for read, write in ((True, False), (False, True), (True, True)):
        z = parse_zero_config({"stage": 3, "offload_optimizer": {"pipeline_read": read, "pipeline_write": write}})
        assert z.offload_optimizer.pipeline is True


def test_gradient_clipping_defaults_to_deepspeeds_1():
    """DeepSpeed 0.19 clips at 1.0 unless told otherwise (GRADIENT_CLIPPING_DEFAULT); 0 turns clipping off."""
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    theirs = ds_config.DeepSpeedConfig({"train_batch_size": 2}, mpu=None).gradient_clipping
    assert load({"train_batch_size": 2}).gradient_clipping == theirs == 1.0
    assert load({"train_batch_size": 2, "gradient_clipping": 0}).gradient_clipping == 0.0
