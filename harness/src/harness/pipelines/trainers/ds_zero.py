"""ds-zero: ZeRO stage 0-3 data parallelism (DeepSpeed's engine API), optimizer offload to CPU or NVMe (ZeRO-Infinity,
swap files under the output directory); checkpoint consolidated with zero_to_fp32."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from harness.pipelines.trainers.common import (
    build_model,
    finish_checkpoint,
    mean_over_ranks,
    rank_batch,
    spec_of,
    training_blocks,
)


def check(spec) -> None:
    stage, offload = spec.options.get("zero_stage", 2), spec.options.get("offload", "none")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"--zero-stage must be 0, 1, 2 or 3, got {stage}")
    if offload not in ("none", "cpu", "nvme"):
        raise ValueError(f"--offload must be cpu, nvme or none, got {offload!r}")
    if offload == "cpu" and stage == 0:
        raise ValueError("--offload cpu needs --zero-stage 1, 2 or 3")
    if offload == "nvme" and stage != 3:
        raise ValueError(f"--offload nvme (ZeRO-Infinity) needs --zero-stage 3, got --zero-stage {stage}")


def ds_config(spec) -> dict:
    zero = {"stage": spec.options.get("zero_stage", 2)}
    offload = spec.options.get("offload", "none")
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif offload == "nvme":  # the optimizer states live in swap files, as DeepSpeed's offload_optimizer.device nvme
        zero["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": str(_nvme_dir(spec)),
            "pipeline_read": True,
            "pipeline_write": True,
        }
    return {
        "train_micro_batch_size_per_gpu": spec.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": spec.lr, "betas": [0.9, 0.95], "weight_decay": 0.0}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": spec.lr,
                "warmup_num_steps": spec.warmup_steps,
                "total_num_steps": spec.steps,
            },
        },
        "zero_optimization": zero,
    }


def _nvme_dir(spec) -> Path:
    return Path(spec.out_dir) / "nvme_swap"


def train(rank: int, world_size: int, spec: dict) -> dict:
    import ds_zero
    import torch.distributed as dist
    from ds_zero.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from tqdm.auto import tqdm

    spec = spec_of(spec)
    data = training_blocks(spec)
    model = build_model(spec)
    engine, _, _, _ = ds_zero.initialize(model=model, model_parameters=model.parameters(), config=ds_config(spec))
    losses, start = [], time.perf_counter()
    for step in tqdm(range(spec.steps), desc="train (ds-zero)", disable=rank != 0):
        batch = rank_batch(data, step, rank, world_size, spec)
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(mean_over_ranks(float(loss)))
    seconds = time.perf_counter() - start
    zero_dir = Path(spec.out_dir) / "ds_zero_checkpoint"
    engine.save_checkpoint(str(zero_dir))
    dist.barrier()
    if rank == 0:
        state = get_fp32_state_dict_from_zero_checkpoint(str(zero_dir))
        full = build_model(spec)
        full.load_state_dict(state, strict=True)
        full.save_pretrained(spec.checkpoint_dir)
        finish_checkpoint(spec)
    engine.destroy()  # releases the engine's hooks and its swap files
    dist.barrier()
    if rank == 0:
        shutil.rmtree(_nvme_dir(spec), ignore_errors=True)  # the swap files are scratch
    return {
        "losses": losses,
        "seconds": seconds,
        "tokens": spec.steps * world_size * data.shape[1] * spec.micro_batch_size,
    }
