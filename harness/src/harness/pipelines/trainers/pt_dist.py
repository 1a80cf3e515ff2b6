"""pt-dist: its DistributedDataParallel or FullyShardedDataParallel on its own backends (shm on one host, tcp across).

pt_dist's group rendezvous through the store of torch's default group (the harness's or torchrun's), so the two
libraries run side by side: torch's group only averages the logged loss. FSDP wraps each decoder layer; its
full state dict, gathered on rank 0, is what the Hugging Face checkpoint is written from.
"""

from __future__ import annotations

import math
import os
import time

from harness.pipelines.trainers import NotBuiltError
from harness.pipelines.trainers.common import (
    build_model,
    finish_checkpoint,
    mean_over_ranks,
    rank_batch,
    spec_of,
    training_blocks,
)


def _fsdp(spec) -> bool:
    return spec.options.get("trainer") == "pt-dist-fsdp"


def check(spec) -> None:
    import pt_dist

    name = "FullyShardedDataParallel" if _fsdp(spec) else "DistributedDataParallel"
    if not hasattr(pt_dist, name):
        raise NotBuiltError(f"pt-dist's {name} is not built yet (issue 28); use --trainer hf-lite, ds-zero or mega-par")
    if spec.device == "cuda":
        raise ValueError(f"--trainer {spec.options.get('trainer')} trains on CPU with pt-dist's shm/tcp backends; "
                         f"pass --device cpu")


def _join(rank: int, world_size: int):
    """A pt_dist default group beside torch's, rendezvoused through torch's store: shm when every rank is on this
    host, tcp otherwise."""
    import pt_dist
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = "shm" if local == world_size else "tcp"
    store = pt_dist.PrefixStore("pt_dist_trainer", dist.distributed_c10d._get_default_store())
    pt_dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=600)


def _wrap(model, spec):
    import pt_dist

    if not _fsdp(spec):
        return pt_dist.DistributedDataParallel(model)
    from hf_lite.models.llama.modeling_llama import LlamaDecoderLayer
    from pt_dist.fsdp import FullyShardedDataParallel, ModuleWrapPolicy

    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))


def _schedule(spec):
    """Linear warm-up, then cosine decay to zero (the hf-lite trainer's schedule)."""
    def lr_lambda(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return lr_lambda


def _save(wrapped, model, rank: int, spec) -> None:
    """Rank 0 writes the Hugging Face checkpoint: DDP's replica as it is, FSDP's gathered full state dict."""
    if not _fsdp(spec):
        if rank == 0:
            model.save_pretrained(spec.checkpoint_dir)
        return
    state = wrapped.full_state_dict(rank0_only=True)
    if rank == 0:
        full = build_model(spec)
        full.load_state_dict(state, strict=True)
        full.save_pretrained(spec.checkpoint_dir)


def train(rank: int, world_size: int, spec: dict) -> dict:
    import pt_dist
    import torch
    from tqdm.auto import tqdm

    spec = spec_of(spec)
    data = training_blocks(spec)
    model = build_model(spec)
    _join(rank, world_size)
    try:
        wrapped = _wrap(model, spec)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(spec))
        label = "pt-dist FSDP" if _fsdp(spec) else "pt-dist DDP"
        losses, start = [], time.perf_counter()
        for step in tqdm(range(spec.steps), desc=f"train ({label})", disable=rank != 0):
            batch = rank_batch(data, step, rank, world_size, spec)
            loss = wrapped(input_ids=batch, labels=batch).loss
            loss.backward()
            if _fsdp(spec):
                wrapped.clip_grad_norm_(1.0)
            else:  # the gradients are averaged already: every rank clips alike
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            schedule.step()
            opt.zero_grad()
            losses.append(mean_over_ranks(float(loss)))
        seconds = time.perf_counter() - start
        _save(wrapped, model, rank, spec)
        if rank == 0:
            finish_checkpoint(spec)
        pt_dist.barrier()
    finally:
        pt_dist.destroy_process_group()
    return {
        "losses": losses,
        "seconds": seconds,
        "tokens": spec.steps * world_size * data.shape[1] * spec.micro_batch_size,
    }
