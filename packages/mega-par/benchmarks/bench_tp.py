"""mega-par benchmark on CPU/gloo, one run, three tables:

1. step time (forward + backward) of one transformer block at TP=2: mega_par's TransformerLayer vs the same
   block sharded with torch DTensor (ColwiseParallel/RowwiseParallel), medians over iterations;
2. TP communication bytes per layer and step, counted by wrapping torch.distributed collectives,
   vs the formula of Megatron-LM (4 all-reduces of b*s*h per layer; SP: 4 all-gathers + 4 reduce-scatters);
3. the 1F1B bubble fraction measured on a 4-stage pipeline vs (p - 1) / (m + p - 1). Stage compute is a fixed
   sleep (forward t, backward 2t) so the number measures the schedule, not the shared CPU.

    uv run python packages/mega-par/benchmarks/bench_tp.py --iters 20
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from mega_par import parallel_state as ps
from mega_par.models.gpt import get_gpt_layer_local_spec
from mega_par.pipeline_parallel import schedules
from mega_par.tensor_parallel.random import model_parallel_cuda_manual_seed
from mega_par.transformer import TransformerConfig, TransformerLayer
from torch import nn

B, S, H, HEADS, FFN = 4, 128, 256, 8, 1024


def _init(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))


class PlainBlock(nn.Module):
    """The same pre-norm SwiGLU/attention block from nn.Linear modules, for DTensor to shard."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.RMSNorm(H), nn.RMSNorm(H)
        self.q, self.k, self.v, self.o = (nn.Linear(H, H, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(H, FFN, bias=False), nn.Linear(H, FFN, bias=False)
        self.down = nn.Linear(FFN, H, bias=False)

    def forward(self, x):  # [b, s, h]
        b, s, _ = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(b, s, -1, H // HEADS).transpose(1, 2) for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(a)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Counter:
    """Counts TP collectives and the bytes each rank sends in a ring implementation of them."""

    def __init__(self, group, tp):
        self.group, self.tp, self.calls, self.bytes, self.saved = group, tp, {}, 0, {}

    def __enter__(self):
        for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
            orig = self.saved[name] = getattr(dist, name)

            def wrapped(*a, _n=name, _o=orig, **k):
                if k.get("group") is self.group:
                    full = max((t for t in a if torch.is_tensor(t)), key=lambda t: t.numel())
                    self.calls[_n] = self.calls.get(_n, 0) + 1
                    # ring: all-reduce sends 2(t-1)/t of the full tensor, all-gather/reduce-scatter (t-1)/t
                    share = (2 if _n == "all_reduce" else 1) * (self.tp - 1) / self.tp
                    self.bytes += int(full.numel() * full.element_size() * share)
                return _o(*a, **k)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        for n, f in self.saved.items():
            setattr(dist, n, f)


def _time_round_robin(fns: dict, iters: int) -> dict:
    """Median step time of each function, interleaved so load changes on a shared machine hit all alike."""
    times = {k: [] for k in fns}
    for i in range(iters + 2):
        for name, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            if i >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def tp_worker(rank, world, port, iters, queue):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init(rank, world, port)
    ps.initialize_model_parallel(2, 1)
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    res, fns = {}, {}
    x = torch.randn(B, S, H)
    for sp in (False, True):
        cfg = TransformerConfig(num_layers=1, hidden_size=H, num_attention_heads=HEADS, ffn_hidden_size=FFN,
                                hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm",
                                add_bias_linear=False, gated_linear_unit=True, activation_func=F.silu,
                                sequence_parallel=sp, tensor_model_parallel_size=2)
        layer = TransformerLayer(cfg, get_gpt_layer_local_spec().submodules, 1)
        xs = x.transpose(0, 1).contiguous()
        if sp:
            xs = xs.chunk(2, 0)[ps.get_tensor_model_parallel_rank()].contiguous()
        xs.requires_grad_()

        def step(layer=layer, xs=xs):
            layer(xs)[0].sum().backward()

        fns[f"mega_par{'_sp' if sp else ''}"] = step
        with Counter(ps.get_tensor_model_parallel_group(), 2) as c:
            step()
        res[f"bytes{'_sp' if sp else ''}"], res[f"calls{'_sp' if sp else ''}"] = c.bytes, c.calls
    mesh = init_device_mesh("cpu", (2,))
    block = PlainBlock()
    parallelize_module(block, mesh, {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
                                     "gate": ColwiseParallel(), "up": ColwiseParallel(),
                                     "o": RowwiseParallel(), "down": RowwiseParallel()})
    xd = x.clone().requires_grad_()
    plain = PlainBlock()
    fns["dtensor"] = lambda: block(xd).sum().backward()
    fns["unsharded"] = lambda: plain(xd).sum().backward()
    res.update(_time_round_robin(fns, iters))
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(res)


class _Sleep(torch.autograd.Function):
    """A stage whose forward takes t seconds and backward 2t, whatever else the CPU is doing."""

    @staticmethod
    def forward(ctx, x, t):
        ctx.t = t
        time.sleep(t)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        time.sleep(2 * ctx.t)
        return g * 1.0, None


class SleepStage(nn.Module):
    def __init__(self, t):
        super().__init__()
        self.t, self.config, self.input_tensor = t, TransformerConfig(num_layers=1, hidden_size=8,
                                                                        num_attention_heads=1), None
        self.w = nn.Parameter(torch.ones(8))

    def set_input_tensor(self, t):
        self.input_tensor = t

    def forward(self, x):
        x = x if self.input_tensor is None else self.input_tensor
        return _Sleep.apply(x * self.w, self.t)


def pp_worker(rank, world, port, ms, t, queue):
    _init(rank, world, port)
    ps.initialize_model_parallel(1, world)
    stage = SleepStage(t)

    def fwd(it, model):
        x = next(it)
        return model(x), lambda out: (out.sum(), {})

    walls = {}
    for m in ms:
        for _ in range(2):  # warm-up, then measured
            data = [torch.ones(4, 1, 8) for _ in range(m)]
            dist.barrier()
            t0 = time.perf_counter()
            schedules.forward_backward_pipelining_without_interleaving(
                forward_step_func=fwd, data_iterator=iter(data), model=stage, num_microbatches=m, seq_length=4,
                micro_batch_size=1)
            walls[m] = time.perf_counter() - t0
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    queue.put((rank, walls))


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--stage-ms", type=float, default=20.0)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(tp_worker, args=(2, _port(), args.iters, q), nprocs=2)
    r = q.get()
    print(f"\n## TP=2 transformer block, b={B} s={S} h={H} heads={HEADS} ffn={FFN}, fwd+bwd, median of {args.iters}")
    print("| implementation | step ms | vs DTensor |")
    print("|---|---|---|")
    for name in ("mega_par", "mega_par_sp", "dtensor", "unsharded"):
        print(f"| {name} | {r[name] * 1e3:.2f} | {r[name] / r['dtensor']:.2f}x |")
    full, t = B * S * H * 4, 2  # bytes of one [s, b, h] fp32 activation; TP size
    print("\n## TP communication per layer and step (fwd+bwd), bytes sent per rank (ring algorithms)")
    print("| mode | collectives counted | measured bytes | formula | formula bytes | ratio |")
    print("|---|---|---|---|---|---|")
    tp_formula = int(4 * 2 * (t - 1) / t * full)
    print(f"| TP | {r['calls']} | {r['bytes']} | 4 all-reduce x 2(t-1)/t x bsh x 4B | {tp_formula} | "
          f"{r['bytes'] / tp_formula:.2f} |")
    sp_formula = int(8 * (t - 1) / t * full)  # the same volume as TP: an all-reduce is a RS + an AG
    print(f"| SP | {r['calls_sp']} | {r['bytes_sp']} | (4 AG + 4 RS) x (t-1)/t x bsh x 4B | {sp_formula} | "
          f"{r['bytes_sp'] / sp_formula:.2f} |")
    p, t = 4, args.stage_ms / 1e3
    print(f"\n## 1F1B bubble, p={p} stages, forward {args.stage_ms:.0f} ms / backward {2 * args.stage_ms:.0f} ms")
    print("| micro-batches m | wall s | ideal busy s | measured bubble | (p-1)/(m+p-1) |")
    print("|---|---|---|---|---|")
    ms = (4, 8, 16)
    mp.spawn(pp_worker, args=(p, _port(), ms, t, q), nprocs=p)
    walls = [q.get()[1] for _ in range(p)]
    for m in ms:
        wall = max(w[m] for w in walls)
        busy = m * 3 * t
        print(f"| {m} | {wall:.3f} | {busy:.3f} | {1 - busy / wall:.3f} | {(p - 1) / (m + p - 1):.3f} |")


if __name__ == "__main__":
    main()
