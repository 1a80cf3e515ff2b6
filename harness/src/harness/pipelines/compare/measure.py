"""What each rank runs for one strategy: set it up, warm up, then time and count ``steps`` steps.

Communication is counted only inside the measured steps (set-up broadcasts and the warm-up's bucket rebuild are
not a step's traffic); memory is the last step's snapshot plus the peak of saved activations over the steps.
"""

from __future__ import annotations

import importlib
import statistics
import time

import torch

from harness.pipelines.compare.comm import CommCounter
from harness.pipelines.compare.memory import ActivationMeter

# name -> (module, setup function, label)
STRATEGIES = {
    "torch-ddp": ("data_parallel", "setup_torch_ddp", "torch DDP"),
    "pt-dist-ddp": ("data_parallel", "setup_pt_dist_ddp", "pt-dist DDP"),
    "pt-dist-fsdp": ("data_parallel", "setup_pt_dist_fsdp", "pt-dist FSDP (FULL_SHARD)"),
    "torch-fsdp2": ("data_parallel", "setup_torch_fsdp2", "torch FSDP2"),
    "zero-1": ("zero", "setup_stage1", "ds-zero ZeRO-1"),
    "zero-2": ("zero", "setup_stage2", "ds-zero ZeRO-2"),
    "zero-3": ("zero", "setup_stage3", "ds-zero ZeRO-3"),
    "zero-2-offload": ("zero", "setup_stage2_offload", "ds-zero ZeRO-2 + CPU offload"),
    "deepspeed-zero-2": ("deepspeed_peer", "setup_stage2", "DeepSpeed ZeRO-2"),
    "deepspeed-zero-3": ("deepspeed_peer", "setup_stage3", "DeepSpeed ZeRO-3"),
    "tp": ("megatron", "setup_tp", "mega-par TP"),
    "tp-sp": ("megatron", "setup_tp_sp", "mega-par TP + SP"),
    "pp": ("megatron", "setup_pp", "mega-par PP (1F1B)"),
}


def setup_of(name: str):
    module, fn, _ = STRATEGIES[name]
    return getattr(importlib.import_module(f"harness.pipelines.compare.strategies.{module}"), fn)


def run_strategy(rank: int, world_size: int, name: str, cfg: dict, steps: int, warmup: int = 2) -> dict:
    """One strategy on this rank: ``{"memory": {kind: bytes}, "comm": per-step counts, "step_seconds": [...]}``."""
    torch.set_num_threads(1)
    counter = CommCounter(world_size)
    counter.enabled = False
    with counter:
        handle = setup_of(name)(rank, world_size, cfg, counter)
        try:
            for i in range(warmup):
                handle.step(i)
            meter, times, losses = ActivationMeter(), [], []
            counter.reset()
            for i in range(warmup, warmup + steps):
                torch.distributed.barrier()  # every rank starts the step together (not counted)
                counter.enabled = True
                t0 = time.perf_counter()
                with meter:
                    losses.append(handle.step(i))
                times.append(time.perf_counter() - t0)
                counter.enabled = False
            comm = counter.totals()
            memory = handle.memory()
            memory["activations"] = meter.peak
        finally:
            handle.close()
    per_step = {
        "collectives": comm["collectives"] / steps,
        "volume_bytes": comm["volume_bytes"] / steps,
        "wire_bytes": comm["wire_bytes"] / steps,
        "by_op": {k: {f: ({b: c / steps for b, c in v.items()} if f == "sizes" else v / steps) for f, v in r.items()}
                  for k, r in comm["by_op"].items()},
    }
    return {
        "name": name,
        "num_params": handle.num_params,
        "memory": memory,
        "comm": per_step,
        "comm_seconds": counter.seconds / steps,
        "step_seconds": times,
        "step_median": statistics.median(times),
        "losses": losses,
    }
