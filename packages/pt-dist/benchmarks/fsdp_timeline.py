"""Draw one FSDP training step as it ran: each unit's compute, its all-gathers and reduce-scatters, on rank 0.

Two ranks train a stack of MLP blocks (each an FSDP unit; FULL_SHARD, forward_prefetch, BACKWARD_PRE) on pt_dist's
shm backend. Rank 0 records when each collective was issued and when it finished (its Work's future), and when
each unit's forward and backward computed (module hooks), for the second step (the first learns the order
prefetching follows), and draws them with matplotlib (imported only here: pt-dist does not depend on it).

    uv run python packages/pt-dist/benchmarks/fsdp_timeline.py --png packages/pt-dist/docs/fsdp_timeline.png
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def _rank(rank: int, world: int, port: int, args, out) -> None:
    import pt_dist
    import torch
    from pt_dist._infra.store import TCPStore
    from pt_dist.fsdp import BackwardPrefetch, FullyShardedDataParallel, ModuleWrapPolicy
    from torch import nn

    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=120, secret=b"timeline")
    pt_dist.init_process_group(args.backend, store=store, rank=rank, world_size=world, timeout=120)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(args.width, 4 * args.width), nn.Linear(4 * args.width, args.width)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(args.blocks)])
    fsdp = FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        forward_prefetch=True,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
    )
    group, events, t0 = pt_dist.group.WORLD, [], [0.0]
    units = [fsdp[k] for k in range(args.blocks)]
    by_shard = {u._handle.flat_param.data_ptr(): k for k, u in enumerate(units)}  # an all-gather reads the shard
    reducing = [None]  # the unit whose gradient is being reduce-scattered

    def now() -> float:
        return time.perf_counter() - t0[0]

    def traced(kind, method, unit_of):
        def call(*a, **kw):
            issued, k = now(), unit_of(a)
            work = method(*a, **kw)
            work.get_future().add_done_callback(lambda f: events.append((kind, k, issued, now())))
            return work

        return call

    group.all_gather_into_tensor = traced(
        "all-gather", group.all_gather_into_tensor, lambda a: by_shard.get(a[1].data_ptr(), "root")
    )
    group.reduce_scatter_tensor = traced("reduce-scatter", group.reduce_scatter_tensor, lambda a: reducing[0])
    spans = {}
    for k, unit in enumerate(units):
        unit.module.register_forward_pre_hook(lambda m, i, k=k: spans.__setitem__(("forward", k), now()))
        unit.module.register_forward_hook(
            lambda m, i, o, k=k: events.append(("forward", k, spans[("forward", k)], now()))
        )

        def pre(real=unit._pre_backward, k=k):  # backward compute: from the unit's gather to its gradient
            real()
            spans.setdefault(("backward", k), now())

        def post(real=unit._handle.on_post_backward, k=k):
            events.append(("backward", k, spans.pop(("backward", k)), now()))
            reducing[0] = k
            real()

        unit._pre_backward, unit._handle.on_post_backward = pre, post
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width)
    for _ in range(2):
        events.clear()
        pt_dist.barrier()
        t0[0] = time.perf_counter()
        fsdp(x).pow(2).mean().backward()
        events.append(("step end", -1, time.perf_counter() - t0[0], time.perf_counter() - t0[0]))
        opt.step()
        opt.zero_grad()
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    if rank == 0:
        out.put(sorted(events, key=lambda e: e[2]))


def draw(events, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {"forward": 2, "backward": 2, "all-gather": 1, "reduce-scatter": 0}
    colors = {"forward": "#4c72b0", "backward": "#dd8452", "all-gather": "#55a868", "reduce-scatter": "#c44e52"}
    fig, ax = plt.subplots(figsize=(11, 3.2))
    last_done = {}
    for kind, unit, issued, done in events:
        if kind not in rows:
            continue
        start = issued
        if kind in ("all-gather", "reduce-scatter"):  # one queue per group: an op starts once the one before ends
            start = max(issued, last_done.get("queue", 0.0))
            last_done["queue"] = done
            ax.plot([issued * 1e3] * 2, [rows[kind] - 0.4, rows[kind] + 0.4], color="black", lw=0.8)
        ax.broken_barh(
            [(start * 1e3, max(done - start, 1e-5) * 1e3)],
            (rows[kind] - 0.35, 0.7),
            facecolors=colors[kind],
            edgecolor="white",
        )
        ax.text((start + done) / 2 * 1e3, rows[kind], str(unit), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks([0, 1, 2], ["reduce-scatter", "all-gather", "compute (fwd / bwd)"])
    ax.set_xlabel("ms since the step began (rank 0); a tick marks when a collective was issued")
    ax.set_title(title, fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in colors]
    ax.legend(handles, list(colors), loc="upper right", fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", default="fsdp_timeline.png")
    ap.add_argument("--backend", default="shm", choices=["shm", "tcp", "gloo"])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 20000 + os.getpid() % 10000
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, q)) for r in range(2)]
    for p in procs:
        p.start()
    events = q.get(timeout=600)
    for p in procs:
        p.join(60)
    for kind, unit, issued, done in events:
        print(f"{kind:15s} unit {unit!s:5s} {issued * 1e3:8.2f} -> {done * 1e3:8.2f} ms")
    draw(
        events,
        args.png,
        f"one FSDP step (FULL_SHARD, forward_prefetch, BACKWARD_PRE), {args.blocks} units, {args.backend}, world 2",
    )
    print(f"timeline: {args.png}")


if __name__ == "__main__":
    main()
