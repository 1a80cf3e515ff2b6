"""Training-step time of pt_dist's DistributedDataParallel (and FullyShardedDataParallel) against torch's, same run.

World size 2, one run: both ranks build every variant of one model (a stack of MLP blocks, ~12M parameters) on
the same data, and the variants take turns rep by rep (a rep: our shm barrier, then ``--steps`` timed training
steps on rank 0), so the shared machine's load hits them alike; we report the median rep per step, and each ratio
as the median over reps of the two variants' times in that rep. Variants:

* ``torch DDP gloo`` / ``pt DDP gloo``: torch's DDP and ours on torch's gloo group (ours through the adapter);
* ``pt DDP shm``: ours on pt_dist's shared-memory backend;
* ``torch DDP pt_shm``: torch's own DDP on a torch group of backend ``pt_shm`` (pt_dist's shared-memory
  collectives registered with torch: ``_compat/torch_backend.py``);
* ``after backward <b>``: the same model without DDP, its gradients all-reduced in one flat buffer after
  backward (no buckets, no overlap): what bucketing and overlap are measured against;
* ``torch FSDP2 gloo`` / ``pt FSDP gloo`` / ``pt FSDP shm``: torch's ``fully_shard`` per block and ours;
* ``--only orig``: FSDP1 per block with ``use_orig_params=True`` (``orig``), torch's and ours, and both without.

Per-rank bytes are sums of tensor sizes at the step's peak (gradients still held): parameters + gradients +
AdamW's state, and apart from them our DDP's buckets (torch's DDP holds buckets of the same size in C++, out of
Python's sight; FSDP has none: its gradient shards are the reduce-scatter's outputs).

    uv run python packages/pt-dist/benchmarks/bench_data_parallel.py
    uv run python packages/pt-dist/benchmarks/bench_data_parallel.py --reps 5 --steps 2 --only ddp
    uv run python packages/pt-dist/benchmarks/bench_data_parallel.py --only orig
"""

from __future__ import annotations

import argparse
import statistics

from _ranks import interleaved, per_rep_ratios, spawn_ranks

DDP_VARIANTS = ["torch DDP gloo", "torch DDP pt_shm", "pt DDP gloo", "pt DDP shm", "after backward gloo",
                "after backward shm"]
FSDP_VARIANTS = ["torch FSDP2 gloo", "pt FSDP gloo", "pt FSDP shm"]
ORIG_VARIANTS = ["torch FSDP1 gloo", "torch FSDP1 orig gloo", "pt FSDP gloo", "pt FSDP orig gloo", "pt FSDP orig shm"]


def _model(width: int, blocks: int):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width,
                                                                                                       width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.norm(x))))

    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(blocks)])


def _state_bytes(params, optimizer) -> int:
    """Parameter, gradient and optimizer-state bytes held by this rank (a gradient that is a bucket's view counts
    once, with the bucket, not here)."""
    import torch

    tensors = [*params, *(p.grad for p in params if p.grad is not None),
               *(v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor))]
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # FSDP2's DTensors: this rank's part
    distinct = {(t.data_ptr(), t.numel(), t.dtype): t.numel() * t.element_size() for t in local}
    return sum(distinct.values())


def _variants(names, rank, world, width, blocks):
    """name -> (module called in the step, parameters, optimizer, after_backward hook, extra tensors)."""
    import pt_dist
    import torch
    import torch.distributed as dist

    shm = pt_dist.new_group(backend="shm")
    groups = {"gloo": pt_dist.group.WORLD, "shm": shm}
    out = {}
    for name in names:  # (groups: each pt_dist variant's group by name, to count what it communicates)
        model = _model(width, blocks)
        after, extra = None, ()
        if name == "torch DDP gloo":
            run = torch.nn.parallel.DistributedDataParallel(model, process_group=dist.group.WORLD)
        elif name == "torch DDP pt_shm":
            run = torch.nn.parallel.DistributedDataParallel(model, process_group=dist.new_group(backend="pt_shm"))
        elif name.startswith("pt DDP"):
            run = pt_dist.DistributedDataParallel(model, process_group=groups[name.split()[-1]])
            extra = [b.buffer for b in run.reducer._buckets]
        elif name.startswith("after backward"):
            run, after = model, _flat_all_reduce(model, groups[name.split()[-1]], world)
        elif name == "torch FSDP2 gloo":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            for block in model:
                fully_shard(block, mesh=mesh)
            run = fully_shard(model, mesh=mesh)
        elif name.startswith("torch FSDP1"):
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            run = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params="orig" in name,
                                           auto_wrap_policy=ModuleWrapPolicy({type(model[0])}))
        elif name.startswith("pt FSDP"):
            from pt_dist.fsdp import FullyShardedDataParallel, ModuleWrapPolicy

            block_type = type(model[0])
            run = FullyShardedDataParallel(model, process_group=groups[name.split()[-1]],
                                           auto_wrap_policy=ModuleWrapPolicy({block_type}),
                                           use_orig_params="orig" in name)
            model = run
        else:
            raise ValueError(f"unknown variant {name!r}")
        params = list(run.parameters())
        out[name] = (run, params, torch.optim.AdamW(params, lr=1e-4, fused=True), after, extra)
    return out, groups


def _flat_all_reduce(model, group, world):
    """All gradients averaged in one all-reduce once backward is over: no buckets, nothing overlapped. The flat
    buffer is kept from step to step, as DDP keeps its buckets (a fresh 45 MB one each step costs its page faults)."""
    import torch

    flat = torch.empty(sum(p.numel() for p in model.parameters()))

    def after():
        grads = [p.grad for p in model.parameters()]
        torch.cat([g.reshape(-1) for g in grads], out=flat)
        group.all_reduce(flat).wait()
        flat.div_(world)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return after


COLLECTIVES = (("all_reduce", 0), ("all_gather_into_tensor", 0), ("reduce_scatter_tensor", 1))


def _payload(step, name, group) -> dict:
    """Bytes handed to each kind of collective on ``group`` during one step of ``name``: the whole tensor (an
    all-reduce's, an all-gather's output, a reduce-scatter's input), counted by wrapping the group's methods."""
    sizes = {}

    def counting(kind, method, which):
        def call(*args, **kwargs):
            t = args[which]
            sizes[kind] = sizes.get(kind, 0) + t.numel() * t.element_size()
            return method(*args, **kwargs)

        return call

    for kind, which in COLLECTIVES:
        setattr(group, kind, counting(kind, getattr(group, kind), which))
    try:
        step(name)
    finally:
        for kind, _ in COLLECTIVES:
            delattr(group, kind)
    return sizes


def _rank(rank, world, port, args, out) -> None:
    import pt_dist
    import torch
    from pt_dist._infra.store import TCPStore

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=600, secret=b"bench")
    pt_dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=600)
    names = (DDP_VARIANTS if args.only in ("all", "ddp") else []) + (FSDP_VARIANTS if args.only in ("all", "fsdp")
                                                                     else [])
    names += ORIG_VARIANTS if args.only == "orig" else []
    variants, groups = _variants(names, rank, world, args.width, args.blocks)
    sync = pt_dist.new_group(backend="shm").barrier  # ranks leave it within microseconds
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)

    memory, buckets = {}, {}

    def step(name):
        run, params, opt, after, extra = variants[name]
        run(x).pow(2).mean().backward()
        if after is not None:
            after()
        opt.step()
        memory[name] = max(memory.get(name, 0), _state_bytes(params, opt))  # the peak: gradients still held
        buckets[name] = sum(t.numel() * t.element_size() for t in extra)
        opt.zero_grad()

    for name in variants:  # warm up: first-touch pages, bucket rebuild, FSDP's lazy init
        step(name)
        step(name)
    times = interleaved(step, list(variants), args.reps, args.steps, sync)
    payload = {name: _payload(step, name, groups["shm"]) for name in variants if name.endswith(" shm")}
    numel = sum(p.numel() for p in _model(args.width, args.blocks).parameters())
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    if rank == 0:
        out.put((times, memory, buckets, payload, numel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8, help="rows per rank and step")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per rep")
    ap.add_argument("--only", choices=["all", "ddp", "fsdp", "orig"], default="all",
                    help="orig: FSDP1 with use_orig_params=True, ours and torch's, beside the flat form")
    args = ap.parse_args()
    world = 2
    times, memory, buckets, payload, numel = spawn_ranks(_rank, world, args, timeout=3600)
    print(f"model: {args.blocks} MLP blocks of width {args.width}, {numel / 1e6:.1f}M parameters; world {world}, "
          f"batch {args.batch} rows per rank; medians of {args.reps} interleaved reps of {args.steps} steps\n")
    print("| variant | step ms (median) | fastest rep | per-rank param+grad+optim MiB | + DDP buckets MiB |")
    print("|---|---|---|---|---|")
    for name, t in times.items():
        bucket = f"{buckets[name] / 2**20:.0f}" if buckets[name] else ("(in C++)" if "DDP" in name else "-")
        print(f"| {name} | {statistics.median(t) * 1e3:.1f} | {min(t) * 1e3:.1f} | {memory[name] / 2**20:.0f} | "
              f"{bucket} |")
    ratios = [("pt DDP gloo / torch DDP gloo", "pt DDP gloo", "torch DDP gloo", "<= 1.05"),
              ("pt DDP shm / torch DDP gloo", "pt DDP shm", "torch DDP gloo", "<= 0.8"),
              ("torch DDP pt_shm / torch DDP gloo", "torch DDP pt_shm", "torch DDP gloo", "<= 0.8"),
              ("pt DDP shm / after backward shm (overlap)", "pt DDP shm", "after backward shm", "< 1"),
              ("pt DDP gloo / after backward gloo (overlap)", "pt DDP gloo", "after backward gloo", "< 1"),
              ("pt FSDP gloo / torch FSDP2 gloo", "pt FSDP gloo", "torch FSDP2 gloo", "<= 1.2"),
              ("pt FSDP shm / torch FSDP2 gloo", "pt FSDP shm", "torch FSDP2 gloo", ""),
              ("pt FSDP gloo / torch FSDP1 gloo", "pt FSDP gloo", "torch FSDP1 gloo", ""),
              ("pt FSDP orig gloo / torch FSDP1 orig gloo", "pt FSDP orig gloo", "torch FSDP1 orig gloo", ""),
              ("pt FSDP orig gloo / pt FSDP gloo (the views' cost)", "pt FSDP orig gloo", "pt FSDP gloo", ""),
              ("pt FSDP orig shm / torch FSDP1 orig gloo", "pt FSDP orig shm", "torch FSDP1 orig gloo", "")]
    print("\n| ratio (median of per-rep ratios) | measured | reps' middle half | target |")
    print("|---|---|---|---|")
    for label, a, b, target in ratios:
        if a in times and b in times:
            med, q1, q3 = per_rep_ratios(times[a], times[b])
            print(f"| {label} | {med:.2f}x | {q1:.2f}-{q3:.2f}x | {target} |")
    if "pt DDP gloo" in memory and "pt FSDP gloo" in memory:
        ddp, fsdp = memory["pt DDP gloo"], memory["pt FSDP gloo"]
        print(f"\nper-rank param+grad+optim bytes, FSDP / DDP: {fsdp / ddp:.2f} (1/world = {1 / world:.2f}); "
              f"with DDP's buckets: {fsdp / (ddp + buckets['pt DDP gloo']):.2f}")
    # a ring sends (N-1)/N of an all-gather's or a reduce-scatter's whole tensor per rank, twice that of an all-reduce
    print("\n| one step, per rank (MiB) | all-reduce | all-gather (outputs) | reduce-scatter (inputs) | ring sends |")
    print("|---|---|---|---|---|")
    for name, sizes in payload.items():
        ar, ag, rs = (sizes.get(kind, 0) / 2**20 for kind, _ in COLLECTIVES)
        sent = (2 * ar + ag + rs) * (world - 1) / world
        print(f"| {name} | {ar:.1f} | {ag:.1f} | {rs:.1f} | {sent:.1f} |")


if __name__ == "__main__":
    main()
