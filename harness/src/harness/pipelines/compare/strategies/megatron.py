"""Megatron-style model parallelism with mega-par's GPT (the same shape as the data-parallel strategies' Llama):
tensor parallelism (with and without sequence parallelism) and 1F1B pipeline parallelism, on all ranks.

The step mirrors ``mega_par.training.pretrain``: the schedule from ``get_forward_backward_func`` runs the step's
micro-batches, the optimizer steps on this rank's shards from their ``main_grad`` buffers. The global batch is the
data-parallel strategies' (``world_size * micro_batch_size`` sequences): TP takes it as one micro-batch, PP as
``pp * 2`` micro-batches.
"""

from __future__ import annotations

import torch

from harness.pipelines.compare.memory import optimizer_state_tensors, tensor_bytes
from harness.pipelines.compare.strategies import Handle, spec_of, tokens


def _args(spec, world_size: int, tp: int, pp: int, sp: bool):
    from mega_par.training import TrainingArgs

    global_batch = spec.global_batch(world_size)
    num_microbatches = 2 * pp if pp > 1 else 1
    if global_batch % num_microbatches:
        raise ValueError(f"the global batch ({global_batch}) must divide into {num_microbatches} micro-batches")
    return TrainingArgs(tp=tp, pp=pp, num_layers=spec.num_hidden_layers, hidden_size=spec.hidden_size,
                        num_attention_heads=spec.num_attention_heads, ffn_hidden_size=spec.intermediate_size,
                        vocab_size=spec.vocab_size, seq_length=spec.seq_length, sequence_parallel=sp,
                        micro_batch_size=global_batch // num_microbatches, num_microbatches=num_microbatches,
                        lr=spec.lr, seed=spec.seed + 1, untie_embeddings_and_output_weights=True)


def _setup(rank, world_size, cfg, tp: int, pp: int, sp: bool) -> Handle:
    from mega_par import parallel_state as ps
    from mega_par.optimizer import OptimizerConfig, get_megatron_optimizer
    from mega_par.pipeline_parallel.schedules import get_forward_backward_func
    from mega_par.tensor_parallel.random import model_parallel_cuda_manual_seed
    from mega_par.training import build_model, forward_step

    spec = spec_of(cfg)
    args = _args(spec, world_size, tp, pp, sp)
    ps.initialize_model_parallel(tp, pp)
    torch.manual_seed(args.seed)
    model_parallel_cuda_manual_seed(args.seed)
    config = args.transformer_config()
    chunks = build_model(args, config)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.0), chunks)
    forward_backward = get_forward_backward_func()
    local = sum(p.numel() for c in chunks for p in c.parameters())
    psi = torch.tensor([local], dtype=torch.int64)  # the model's size: TP shards summed over TP, stages over PP
    torch.distributed.all_reduce(psi, group=ps.get_model_parallel_group())
    dup = sum(p.numel() for c in chunks for p in c.parameters() if not getattr(p, "tensor_model_parallel", False))
    psi = int(psi[0]) - (tp - 1) * dup  # norm weights are replicated on every TP rank: counted once
    last = {}

    def step(i: int) -> float:
        x = tokens(spec, i, world_size)
        mbs = [{"tokens": mb[:, :-1].contiguous(), "labels": mb[:, 1:].contiguous()}
               for mb in x.split(args.micro_batch_size)]
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=iter(mbs), model=chunks[0],
                                  num_microbatches=args.num_microbatches, seq_length=args.seq_length,
                                  micro_batch_size=args.micro_batch_size)
        params = [p for c in chunks for p in c.parameters()]
        grads = [p.main_grad for p in params if hasattr(p, "main_grad")]
        optimizer.step()
        last.update(parameters=tensor_bytes(p.detach() for p in params), gradients=tensor_bytes(grads),
                    optimizer_states=tensor_bytes(optimizer_state_tensors(optimizer.optimizer)))
        return float(torch.stack([d["lm loss"] for d in losses]).mean()) if losses else float("nan")

    return Handle(step=step, memory=lambda: dict(last), num_params=psi, close=ps.destroy_model_parallel)


def setup_tp(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, world_size, 1, False)


def setup_tp_sp(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, world_size, 1, True)


def setup_pp(rank, world_size, cfg, counter) -> Handle:
    return _setup(rank, world_size, cfg, 1, world_size, False)
