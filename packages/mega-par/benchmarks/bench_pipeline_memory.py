"""Activation memory per pipeline stage: 1F1B vs all-forward-all-backward (GPipe), on CPU/gloo.

A Llama-style GPT split one layer per stage over ``p`` ranks trains one step of ``m`` micro-batches under three
schedules; ``ActivationMemoryTracker`` (saved-tensor hooks plus the stage outputs still alive) records each
stage's peak activation bytes. 1F1B keeps at most ``min(p - r, m)`` micro-batches in flight on stage ``r``
(Narayanan et al., arXiv 2104.04473 §2.2); all-forward-all-backward keeps all ``m``. With
``deallocate_pipeline_outputs`` (Megatron's ``deallocate_output_tensor``) a sent output keeps only its graph.

    uv run python packages/mega-par/benchmarks/bench_pipeline_memory.py --stages 4 --microbatches 8
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from mega_par import parallel_state as ps
from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
from mega_par.pipeline_parallel import schedules
from mega_par.pipeline_parallel.activation_memory import (
    ActivationMemoryTracker,
    forward_backward_pipelining_all_forward_all_backward,
)
from mega_par.tensor_parallel import model_parallel_cuda_manual_seed
from mega_par.transformer import TransformerConfig

B, S, H, HEADS, FFN, VOCAB = 4, 128, 256, 8, 1024, 512
SCHEDULES = {  # name -> (schedule, deallocate_pipeline_outputs)
    "1F1B": (schedules.forward_backward_pipelining_without_interleaving, True),
    "1F1B, outputs kept": (schedules.forward_backward_pipelining_without_interleaving, False),
    "all-fwd-all-bwd": (forward_backward_pipelining_all_forward_all_backward, True),
}


def _stage(dealloc: bool) -> GPTModel:
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    cfg = TransformerConfig(
        num_layers=ps.get_pipeline_model_parallel_world_size(), hidden_size=H, num_attention_heads=HEADS,
        ffn_hidden_size=FFN, hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm",
        add_bias_linear=False, gated_linear_unit=True, activation_func=F.silu, deallocate_pipeline_outputs=dealloc,
    )  # fmt: skip
    return GPTModel(cfg, get_gpt_layer_local_spec(), VOCAB, S, pre_process=ps.is_pipeline_first_stage(),
                    post_process=ps.is_pipeline_last_stage(), position_embedding_type="rope", seed=3)  # fmt: skip


def _step(data_iterator, model):
    tokens = next(data_iterator)
    out = model(tokens[:, :-1], None, None, labels=tokens[:, 1:])
    return out, lambda o: (o.mean(), {"lm loss": o.mean().detach()})


def worker(rank, world, port, m, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    ps.initialize_model_parallel(1, world)
    peaks = {}
    for name, (fn, dealloc) in SCHEDULES.items():
        model = _stage(dealloc)
        data = [torch.randint(0, VOCAB, (B, S + 1), generator=torch.Generator().manual_seed(i)) for i in range(m)]
        tracker = ActivationMemoryTracker(model)
        with tracker:
            fn(forward_step_func=tracker.wrap(_step), data_iterator=iter(data), model=model, num_microbatches=m,
               seq_length=S, micro_batch_size=B)  # fmt: skip
        peaks[name] = tracker.peak_bytes
    one = ActivationMemoryTracker(model)  # what one micro-batch alone saves on this stage
    model.set_input_tensor(None if ps.is_pipeline_first_stage() else torch.randn(S, B, H, requires_grad=True))
    with one:
        _step(iter(data), model)
    peaks["one micro-batch"] = one.peak_bytes
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    queue.put((rank, peaks))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    args = ap.parse_args()
    p, m = args.stages, args.microbatches
    q = mp.get_context("spawn").Queue()
    mp.spawn(worker, args=(p, _port(), m, q), nprocs=p)
    peaks = dict(q.get() for _ in range(p))
    mib = 2**20
    print(f"\n## Activation memory per stage, p={p} stages x 1 layer, m={m} micro-batches, b={B} s={S} h={H} "
          f"ffn={FFN}, fp32 (MiB, peak)")  # fmt: skip
    print(f"| stage | one micro-batch | {' | '.join(SCHEDULES)} | in flight min(p-r, m) | 1F1B / all-fwd-all-bwd |")
    print("|---" * (len(SCHEDULES) + 4) + "|")
    for r in range(p):
        row = peaks[r]
        cells = " | ".join(f"{row[n] / mib:.1f}" for n in SCHEDULES)
        ratio = row["1F1B"] / row["all-fwd-all-bwd"]
        print(f"| {r} | {row['one micro-batch'] / mib:.1f} | {cells} | {min(p - r, m)} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
