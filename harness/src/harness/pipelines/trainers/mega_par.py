"""mega-par: Megatron-style tensor / pipeline / data parallelism on its own GPT model; checkpoint merged by to_hf."""

from __future__ import annotations

import time
from pathlib import Path

from harness.pipelines.trainers.common import finish_checkpoint, spec_of


def check(spec) -> None:
    tp, pp = spec.options.get("tp", 1), spec.options.get("pp", 1)
    nproc, m = spec.options.get("nproc", 2), spec.model
    for name, v in (("--tp", tp), ("--pp", pp)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if m.num_attention_heads % tp or m.num_key_value_heads % tp:
        raise ValueError(
            f"--tp {tp} does not divide the model's {m.num_attention_heads} attention heads "
            f"and {m.num_key_value_heads} KV heads"
        )
    if nproc % (tp * pp):
        raise ValueError(f"--nproc {nproc} is not a multiple of --tp {tp} x --pp {pp}")
    if m.num_hidden_layers % pp:
        raise ValueError(f"--pp {pp} does not divide the model's {m.num_hidden_layers} layers")
    if spec.options.get("sp") and tp == 1:
        raise ValueError("--sp (sequence parallelism) needs --tp > 1")


def train(rank: int, world_size: int, spec: dict) -> dict:
    import torch.distributed as dist
    from mega_par.checkpointing import to_hf
    from mega_par.training import TrainingArgs, pretrain

    spec = spec_of(spec)
    m, o = spec.model, spec.options
    tp, pp = o.get("tp", 1), o.get("pp", 1)
    save = Path(spec.out_dir) / "mega_par_checkpoint"
    args = TrainingArgs(
        tp=tp,
        pp=pp,
        num_layers=m.num_hidden_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_key_value_heads,
        ffn_hidden_size=m.intermediate_size,
        vocab_size=m.vocab_size,
        seq_length=m.seq_length,
        sequence_parallel=bool(o.get("sp")),
        micro_batch_size=spec.micro_batch_size,
        num_microbatches=max(pp, 1) * (2 if pp > 1 else 1),
        train_iters=spec.steps,
        lr=spec.lr,
        clip_grad=1.0,
        seed=spec.seed + 1,
        data_path=str(Path(spec.out_dir) / "tokens.bin"),
        save=str(save),
        progress=rank == 0,
        untie_embeddings_and_output_weights=True,
    )
    start = time.perf_counter()
    losses = pretrain(args)
    seconds = time.perf_counter() - start
    dist.barrier()
    if rank == 0:
        to_hf(str(save), spec.checkpoint_dir)
        finish_checkpoint(spec)
    dist.barrier()
    dp = world_size // (tp * pp)
    tokens = spec.steps * dp * args.num_microbatches * args.micro_batch_size * m.seq_length
    return {"losses": losses, "seconds": seconds, "tokens": tokens}
