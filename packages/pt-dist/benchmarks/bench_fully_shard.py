"""Training-step time of pt_dist's FSDP2 (``pt_dist.fsdp.fully_shard``) against torch's ``fully_shard``, same ranks.

World size 2, one run: pt_dist's world is the gloo adapter, so torch's default group is the same gloo world;
both ranks build every variant of one tiny MLP (``--layers`` Linear(width, width) + ReLU, each layer
``fully_shard``-ed, then the root) on the same data. The variants take turns rep by rep (a rep: a shm barrier,
then ``--steps`` timed steps: forward, backward, ``Adam(foreach=False)`` step on the DTensor parameters), so the
shared machine's load hits them alike; we report the median rep per step and each ratio as the median over reps
of the two variants' times within one rep. Variants:

* ``torch fully_shard gloo``: torch's FSDP2 on its gloo group;
* ``pt fully_shard gloo``: ours on the same gloo transport (through pt_dist's adapter): the ratio is FSDP2's
  own machinery, ours in Python against torch's;
* ``pt fully_shard shm`` / ``pt fully_shard tcp``: ours on pt_dist's shared-memory and socket backends.

    uv run python packages/pt-dist/benchmarks/bench_fully_shard.py
    uv run python packages/pt-dist/benchmarks/bench_fully_shard.py --width 512 --layers 8 --reps 9
"""

from __future__ import annotations

import argparse
import statistics

from _ranks import interleaved, per_rep_ratios, spawn_ranks

VARIANTS = ["torch fully_shard gloo", "pt fully_shard gloo", "pt fully_shard shm", "pt fully_shard tcp"]


def _model(width: int, layers: int):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)])


def _variants(world, width, layers):
    import pt_dist
    import torch
    from pt_dist.device_mesh import DeviceMesh
    from pt_dist.device_mesh import init_device_mesh as pt_mesh
    from pt_dist.fsdp import fully_shard as pt_fully_shard
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    meshes = {"torch fully_shard gloo": (torch_fully_shard, torch_mesh("cpu", (world,))),
              "pt fully_shard gloo": (pt_fully_shard, pt_mesh("cpu", (world,))),
              "pt fully_shard shm": (pt_fully_shard, DeviceMesh.from_group(pt_dist.new_group(backend="shm"), "cpu")),
              "pt fully_shard tcp": (pt_fully_shard, DeviceMesh.from_group(pt_dist.new_group(backend="tcp"), "cpu"))}
    out = {}
    for name, (fully_shard, mesh) in meshes.items():
        model = _model(width, layers)
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        out[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False))
    return out


def _rank(rank, world, port, args, out) -> None:
    import pt_dist
    import torch
    from pt_dist._infra.store import TCPStore

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=600, secret=b"bench")
    pt_dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=600)
    variants = _variants(world, args.width, args.layers)
    sync = pt_dist.new_group(backend="shm").barrier
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))
    losses = {}

    def step(name):
        model, opt = variants[name]
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.setdefault(name, []).append(loss.item())

    for name in variants:  # warm up: lazy init, first-touch pages, the transports' buffers
        step(name)
        step(name)
    times = interleaved(step, list(variants), args.reps, args.steps, sync)
    numel = sum(p.numel() for p in _model(args.width, args.layers).parameters())
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    if rank == 0:
        out.put((times, losses, numel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="rows per rank and step")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per rep")
    args = ap.parse_args()
    world = 2
    times, losses, numel = spawn_ranks(_rank, world, args)
    same = all(losses[name] == losses[VARIANTS[0]] for name in VARIANTS)
    print(f"model: {args.layers} x Linear({args.width}, {args.width}) + ReLU, {numel / 1e6:.2f}M parameters, each "
          f"layer and the root fully_shard-ed; world {world}, batch {args.batch} rows per rank; medians of {args.reps} "
          f"interleaved reps of {args.steps} steps (forward + backward + Adam); every variant's losses identical: "
          f"{same}\n")
    print("| variant | step ms (median) | fastest rep |")
    print("|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t) * 1e3:.2f} | {min(t) * 1e3:.2f} |")
    print("\n| ratio (median of per-rep ratios) | measured | reps' middle half |")
    print("|---|---|---|")
    for name in VARIANTS[1:]:
        med, q1, q3 = per_rep_ratios(times[name], times[VARIANTS[0]])
        print(f"| {name} / {VARIANTS[0]} | {med:.2f}x | {q1:.2f}-{q3:.2f}x |")


if __name__ == "__main__":
    main()
