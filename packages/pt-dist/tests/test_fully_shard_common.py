"""Shared helpers of the FSDP2 test files, no tests of its own (torch's
test/distributed/_composable/fsdp/_test_fully_shard_common.py plays this part upstream).

``two_worlds`` puts torch's default group (gloo, over a TCPStore whose port travels through ``harness.store()``)
and pt_dist's own default group (tcp) in the same ranks; ``side_by_side`` builds one model twice from one seed,
shards it with torch's ``fully_shard`` and with ours, and ``Compare`` checks loss, every gradient (``full_tensor``
and the local shard) and every parameter after the optimizer step, bit for bit, counting what it compared.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import harness

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import join, leave  # noqa: E402


@contextlib.contextmanager
def two_worlds(rank: int, world: int, key: str, backend: str = "tcp"):
    """torch's default group first (gloo), so pt_dist's world (``backend``) does not become torch's."""
    if rank == 0:
        tstore = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=90))
        harness.store().set(f"{key}_torch_port", str(tstore.port))
    else:
        tstore = dist.TCPStore("127.0.0.1", int(harness.store().get(f"{key}_torch_port")), world,
                               timeout=datetime.timedelta(seconds=90))
    dist.init_process_group("gloo", store=tstore, rank=rank, world_size=world)
    join(rank, world, backend, timeout=90, key=key)
    try:
        yield
    finally:
        leave()
        dist.destroy_process_group()


def meshes(shape: tuple[int, ...], names: tuple[str, ...] | None = None):
    """The same mesh twice: torch's (over gloo) and pt_dist's."""
    from pt_dist.device_mesh import init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh

    return torch_mesh("cpu", shape, mesh_dim_names=names), init_device_mesh("cpu", shape, mesh_dim_names=names)


def side_by_side(build, shard, shape=(2,), names=None, **policies):
    """``build()`` twice from seed 0; ``shard(model, fully_shard, mesh, **kwargs)`` applies each library's
    ``fully_shard``. ``policies``: ``mp`` / ``offload`` dicts of ``MixedPrecisionPolicy`` / ``CPUOffloadPolicy``
    fields (None: default), constructed with each library's class; ``mp_ours`` gives ours another policy (the
    negative controls: a comparison that must fail)."""
    import pt_dist.fsdp as our_fsdp
    import torch.distributed.fsdp as torch_fsdp

    torch_mesh, our_mesh = meshes(shape, names)
    models = []
    for lib, mesh in ((torch_fsdp, torch_mesh), (our_fsdp, our_mesh)):
        torch.manual_seed(0)
        model = build()
        kwargs = {}
        mp = policies.get("mp_ours", policies.get("mp")) if lib is our_fsdp else policies.get("mp")
        if mp is not None:
            kwargs["mp_policy"] = lib.MixedPrecisionPolicy(**mp)
        if policies.get("offload") is not None:
            kwargs["offload_policy"] = lib.CPUOffloadPolicy(**policies["offload"])
        shard(model, lib.fully_shard, mesh, **kwargs)
        models.append(model)
    return models


class Compare:
    """Exact comparisons of torch's FSDP2 model (``theirs``) and ours; ``fails`` lists mismatches, ``count`` what
    was compared (a rank that compared nothing fails the test)."""

    def __init__(self, label: str):
        self.label, self.fails, self.count = label, [], 0

    def eq(self, what: str, theirs, ours) -> None:
        self.count += 1
        same = (isinstance(ours, torch.Tensor) and isinstance(theirs, torch.Tensor) and ours.dtype == theirs.dtype
                and ours.shape == theirs.shape and torch.equal(ours, theirs)) if isinstance(theirs, torch.Tensor) \
            else theirs == ours
        if not same:
            self.fails.append(f"{self.label} {what}: torch {_short(theirs)} ours {_short(ours)}")

    def grads(self, step, theirs, ours) -> None:
        for (name, pt), po in zip(theirs.named_parameters(), ours.parameters()):
            if pt.grad is None or po.grad is None:
                self.eq(f"step {step} {name}.grad is None", pt.grad is None, po.grad is None)
                continue
            self.eq(f"step {step} {name}.grad type", type(pt.grad).__name__, type(po.grad).__name__)
            if not hasattr(pt.grad, "placements"):  # an unsharded parameter's (accumulating without sync)
                self.eq(f"step {step} {name}.grad", pt.grad, po.grad)
                continue
            self.eq(f"step {step} {name}.grad placements", str(pt.grad.placements), str(po.grad.placements))
            self.eq(f"step {step} {name}.grad local", pt.grad.to_local(), po.grad.to_local())
            self.eq(f"step {step} {name}.grad full", pt.grad.full_tensor(), po.grad.full_tensor())

    def params(self, step, theirs, ours) -> None:
        for (name, pt), po in zip(theirs.named_parameters(), ours.parameters()):
            self.eq(f"step {step} {name} type", type(pt).__name__, type(po).__name__)
            if hasattr(pt, "to_local") and hasattr(po, "to_local"):
                self.eq(f"step {step} {name} local", pt.to_local(), po.to_local())

    def result(self):
        return self.fails, self.count


def _short(x):
    return x.flatten()[:4].tolist() if isinstance(x, torch.Tensor) else x


def train_compare(cmp: Compare, theirs, ours, batch, steps: int = 2, micro: int = 1, loss=None):
    """``steps`` optimizer steps (Adam, foreach=False) of both models on ``batch(step, micro)``, ``micro``
    micro-batches each (without gradient sync but the last); compares loss, output dtypes and gradients after every
    backward, parameters after every step."""
    loss = loss or (lambda out, step: out.float().square().mean())
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2, foreach=False) for m in (theirs, ours)]
    for step in range(steps):
        for mb in range(micro):
            x = batch(step, mb)
            losses, dtypes = [], []
            for m in (theirs, ours):
                if micro > 1:
                    m.set_requires_gradient_sync(mb == micro - 1)
                out = m(x)
                dtypes.append([t.dtype for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)])
                losses.append(loss(out, step))
                losses[-1].backward()
            cmp.eq(f"step {step}.{mb} loss", *losses)
            cmp.eq(f"step {step}.{mb} output dtypes", *dtypes)
            cmp.grads(f"{step}.{mb}", theirs, ours)
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=step % 2 == 0)
        cmp.params(step, theirs, ours)
    return cmp.result()
