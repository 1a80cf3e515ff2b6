"""A Llama block's training step under ``parallelize_module``: ``pt_dist.tensor.parallel`` against torch's, same ranks.

World size 2 (TP=2), one run: pt_dist's world is the gloo adapter, so torch's default group is the same gloo world
and both libraries' DTensors move their bytes over the same transport. The block is torchtitan's Llama layer
(RMSNorm, attention with RoPE and causal ``scaled_dot_product_attention``, SwiGLU feed-forward) with torchtitan's
plan, in two forms:

* ``TP``: q/k/v and w1/w3 ``ColwiseParallel`` (this rank's heads as plain tensors), wo and w2 ``RowwiseParallel``
  (an all-reduce each in forward, and one per colwise input in backward); the norms replicated;
* ``TP+SP``: the same plus ``SequenceParallel`` norms, the block's activations sharded on the sequence between the
  sublayers (all-gather into attention and the feed-forward, reduce-scatter out of wo and w2).

A step: forward, ``out.pow(2).mean()`` backward, SGD. Timed: the median rep (``--steps`` steps) per variant, the
variants taking turns rep by rep (``_ranks.interleaved``), ratios as the median of per-rep ratios. Bytes: one
untimed step per variant with every collective's input tensor counted on rank 0 (torch's: the
``_c10d_functional`` ops DTensor dispatches, seen by a ``TorchDispatchMode`` as torch's ``CommDebugMode`` sees
them; pt_dist's: the calls ``pt_dist.tensor._collective_utils`` makes on its groups).

    uv run python packages/pt-dist/benchmarks/bench_tensor_parallel.py
    uv run python packages/pt-dist/benchmarks/bench_tensor_parallel.py --dim 512 --seq 256 --reps 9 --steps 5
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter

from _ranks import interleaved, per_rep_ratios, spawn_ranks

LIBS = ["torch", "pt"]
MODES = ["TP", "TP+SP"]


def _block_class():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Attention(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.head_dim = dim // heads
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x, *, cos, sin):
            b, s, _ = x.shape  # -1 heads: this rank's under tensor parallelism
            q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
            q, k = (t * cos + rotate_half(t) * sin for t in (q, k))
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            return self.wo(o.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.w1, self.w3 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(dim, 4 * dim, bias=False)
            self.w2 = nn.Linear(4 * dim, dim, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self, dim, heads):
            super().__init__()
            self.attention_norm, self.attention = RMSNorm(dim), Attention(dim, heads)
            self.ffn_norm, self.feed_forward = RMSNorm(dim), FeedForward(dim)

        def forward(self, x, cos, sin):
            x = x + self.attention(self.attention_norm(x), cos=cos, sin=sin)
            return x + self.feed_forward(self.ffn_norm(x))

    return Block


def _plan(api, placements, sequence_parallel: bool) -> dict:
    """torchtitan's plan for one layer; q/k/v give this rank's heads as plain tensors."""
    R, seq = placements.Replicate(), placements.Shard(1)
    plan = {"attention.wq": api.ColwiseParallel(use_local_output=True),
            "attention.wk": api.ColwiseParallel(use_local_output=True),
            "attention.wv": api.ColwiseParallel(use_local_output=True),
            "feed_forward.w1": api.ColwiseParallel(), "feed_forward.w3": api.ColwiseParallel()}
    if not sequence_parallel:
        return {**plan, "attention.wo": api.RowwiseParallel(), "feed_forward.w2": api.RowwiseParallel()}
    return {**plan, "attention_norm": api.SequenceParallel(), "ffn_norm": api.SequenceParallel(),
            "attention": api.PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(R,)),
            "attention.wo": api.RowwiseParallel(output_layouts=seq),
            "feed_forward": api.PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(R,)),
            "feed_forward.w2": api.RowwiseParallel(output_layouts=seq)}


class _PtCounter:
    """Stands in for ``pt_dist.distributed_c10d`` inside ``pt_dist.tensor._collective_utils``: each collective's
    input tensor (the second argument where the first is the output) counted into ``counts`` while ``on``."""

    INPUT_AT = {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1, "all_to_all_single": 1, "all_reduce": 0,
                "broadcast": 0}

    def __init__(self, c10d):
        self.c10d, self.on, self.counts = c10d, False, Counter()

    def __getattr__(self, name):
        fn = getattr(self.c10d, name)
        if name not in self.INPUT_AT:
            return fn

        def counted(*args, **kwargs):
            if self.on:
                t = args[self.INPUT_AT[name]]
                self.counts[name] += 1
                self.counts["bytes"] += t.numel() * t.element_size()
            return fn(*args, **kwargs)

        return counted


def _torch_counter():
    """A dispatch mode counting torch's collectives and their input bytes as torch's ``CommDebugMode`` finds them:
    it lets DTensor's own dispatch run first (``NotImplemented``), so the collectives a DTensor op makes inside
    its dispatch (an optimizer's ``add_`` of a ``Partial`` gradient) reach the mode too."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    c10d_names = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather_into_tensor",
                  "_reduce_scatter_base_": "reduce_scatter_tensor", "alltoall_base_": "all_to_all_single",
                  "broadcast_": "broadcast"}

    class Counted(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented
            name = func.overloadpacket.__name__
            name = c10d_names.get(name) if func.namespace == "c10d" else name.removesuffix("_")
            if func.namespace in ("c10d", "_c10d_functional") and name in _PtCounter.INPUT_AT:
                first = args[0] if func.namespace == "_c10d_functional" else args[1 if "base" in str(func) else 0]
                ts = [t for t in (first if isinstance(first, (list, tuple)) else [first])
                      if isinstance(t, torch.Tensor)]
                self.counts[name] += 1
                self.counts["bytes"] += sum(t.numel() * t.element_size() for t in ts)
            return func(*args, **(kwargs or {}))

    return Counted()


def _rank(rank, world, port, args, out) -> None:
    import pt_dist
    import pt_dist.tensor as ptt
    import pt_dist.tensor._collective_utils as pt_collectives
    import pt_dist.tensor.parallel as ours
    import torch
    import torch.distributed.tensor as tt
    import torch.distributed.tensor.parallel as theirs
    from pt_dist._infra.store import TCPStore
    from pt_dist.device_mesh import init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=600, secret=b"bench")
    pt_dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=600)
    meshes = {"torch": (torch_mesh("cpu", (world,)), theirs, tt), "pt": (init_device_mesh("cpu", (world,)), ours, ptt)}
    pt_counter = _PtCounter(pt_collectives.c10d)
    pt_collectives.c10d = pt_counter
    Block = _block_class()
    b, s, d, hd = args.batch, args.seq, args.dim, args.dim // args.heads
    x = torch.randn(b, s, d, generator=torch.Generator().manual_seed(1))
    angle = torch.arange(s)[:, None] * torch.arange(hd)[None] * 0.01
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    steps, checks = {}, {}
    for mode in MODES:
        sp = mode == "TP+SP"
        inp = x.chunk(world, dim=1)[rank].contiguous() if sp else x  # SP: this rank's sequence shard
        for lib in LIBS:
            mesh, api, placements = meshes[lib]
            torch.manual_seed(0)
            block = api.parallelize_module(Block(d, args.heads), mesh, _plan(api, placements, sp))
            opt = torch.optim.SGD(block.parameters(), lr=1e-3)

            def step(block=block, opt=opt, inp=inp):
                o = block(inp, cos, sin)
                o = o.to_local() if hasattr(o, "to_local") else o
                o.pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                return o

            checks[(mode, lib)] = step().sum().item()  # warm up; the first step's output
            steps[(mode, lib)] = step

    # bytes: one more untimed step each, counted
    comm = {}
    for (mode, lib), step in steps.items():
        if lib == "torch":
            with _torch_counter() as counter:
                step()
            comm[(mode, lib)] = dict(counter.counts)
        else:
            pt_counter.on, pt_counter.counts = True, Counter()
            step()
            pt_counter.on = False
            comm[(mode, lib)] = dict(pt_counter.counts)
    sync = pt_dist.new_group(backend="shm").barrier
    times = interleaved(lambda key: steps[key](), list(steps), args.reps, args.steps, sync)
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    if rank == 0:
        out.put((times, checks, comm))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per rep")
    args = ap.parse_args()
    world = 2
    times, checks, comm = spawn_ranks(_rank, world, args)
    print(f"world {world} (TP=2, gloo), Llama block dim {args.dim}, {args.heads} heads, seq {args.seq}, batch "
          f"{args.batch}, float32; step = forward + backward + SGD; medians of {args.reps} interleaved reps of "
          f"{args.steps} steps; bytes = collective inputs on rank 0 per step\n")
    print("| plan | torch ms | pt ms | pt / torch (IQR) | torch collectives | pt collectives | torch MB | pt MB "
          "| bytes equal | first output equal |")
    print("|---" * 10 + "|")
    for mode in MODES:
        t, p = times[(mode, "torch")], times[(mode, "pt")]
        ratio, lo, hi = per_rep_ratios(p, t)
        ct, cp = comm[(mode, "torch")], comm[(mode, "pt")]
        kinds = {lib: ", ".join(f"{k} {v}" for k, v in sorted(c.items()) if k != "bytes") for lib, c in
                 (("torch", ct), ("pt", cp))}
        same = abs(checks[(mode, "pt")] - checks[(mode, "torch")]) <= 1e-4 * max(1.0, abs(checks[(mode, "torch")]))
        print(f"| {mode} | {statistics.median(t) * 1e3:.1f} | {statistics.median(p) * 1e3:.1f} | {ratio:.2f}x "
              f"({lo:.2f}-{hi:.2f}) | {kinds['torch']} | {kinds['pt']} | {ct.get('bytes', 0) / 1e6:.3f} | "
              f"{cp.get('bytes', 0) / 1e6:.3f} | {ct.get('bytes', 0) == cp.get('bytes', 0)} | {same} |")


if __name__ == "__main__":
    main()
