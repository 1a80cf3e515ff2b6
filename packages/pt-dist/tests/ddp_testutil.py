"""DDP and FSDP test helpers (imported by path): toy models and the side-by-side trainers the tests share.

``train_side_by_side`` trains three copies of one model for a few steps: a single process on the whole batch,
pt_dist's DistributedDataParallel and torch's on each rank's slice, and checks after every step that the
parameters agree (the CS336 test shape, plus torch as a second reference).
"""

from __future__ import annotations

import copy

import pt_dist
import torch
from torch import nn


class Toy(nn.Module):
    """Tied (``out`` shares ``hidden``'s weight), frozen (``frozen``) and float64 (``wide``) parameters; returns a
    dict holding a tuple. With ``branches``, the forward's ``branch`` argument picks which of two heads runs, and
    ``never`` is used by no rank."""

    def __init__(self, branches: bool = False, width: int = 12):
        super().__init__()
        self.embed = nn.Linear(6, width)
        self.hidden = nn.Linear(width, width)
        self.frozen = nn.Linear(width, width).requires_grad_(False)
        self.out = nn.Linear(width, width, bias=False)
        self.out.weight = self.hidden.weight
        self.head = nn.Linear(width, 3)
        self.wide = nn.Linear(width, 2).double()
        if branches:
            self.branch_a, self.branch_b, self.never = nn.Linear(width, 3), nn.Linear(width, 3), nn.Linear(width, 3)

    def forward(self, x, branch=None):
        h = torch.tanh(self.hidden(torch.tanh(self.embed(x))))
        h = torch.tanh(self.out(self.frozen(h)))
        y = self.head(h)
        if branch is not None:
            y = y + getattr(self, f"branch_{branch}")(h)
        return {"y": y, "extra": (self.wide(h.double()),)}


def toy_loss(model, x, target, rank, branch_of=None):
    out = model(x, None if branch_of is None else branch_of(rank))
    return torch.nn.functional.mse_loss(out["y"], target) + out["extra"][0].pow(2).mean().float()


def batches(world: int, step: int, per_rank: int = 4, features: int = 6, outputs: int = 3):
    """Step ``step``'s batch, cut into ``world`` slices (the same on every rank)."""
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(world * per_rank, features, generator=g), torch.randn(world * per_rank, outputs, generator=g)
    return x.chunk(world), y.chunk(world)


def train_side_by_side(rank, world, torch_pg, checks, label, make_model, loss_fn=toy_loss, steps=5, micro=1,
                       lr=0.1, single=True, inspect=None, **ddp_kwargs):
    """pt_dist DDP vs torch DDP (vs a single process) for ``steps`` steps of ``micro`` micro-batches each (all
    but the last under ``no_sync``); ``inspect(step, ddp)`` runs after each backward; returns pt_dist's DDP."""
    torch.manual_seed(0)
    base = make_model()
    models = {"single": copy.deepcopy(base), "pt_dist": copy.deepcopy(base), "torch": copy.deepcopy(base)}
    ddps = {"pt_dist": pt_dist.DistributedDataParallel(models["pt_dist"], **ddp_kwargs),
            "torch": torch.nn.parallel.DistributedDataParallel(models["torch"], process_group=torch_pg, **ddp_kwargs)}
    opts = {k: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr) for k, m in models.items()}
    for step in range(steps):
        for m in range(micro):
            xs, ys = batches(world, step * micro + m)
            if single:
                (sum(loss_fn(models["single"], xs[r], ys[r], r) for r in range(world)) / world).backward()
            for ddp in ddps.values():
                if m < micro - 1:
                    with ddp.no_sync():
                        loss_fn(ddp, xs[rank], ys[rank], rank).backward()
                else:
                    loss_fn(ddp, xs[rank], ys[rank], rank).backward()
        if inspect is not None:
            inspect(step, ddps["pt_dist"])
        for opt in opts.values():
            opt.step()
            opt.zero_grad()
        for (name, p), q, s in zip(models["pt_dist"].named_parameters(), models["torch"].parameters(),
                                   models["single"].parameters()):
            checks(f"{label} step {step} {name} vs torch DDP", p.detach(), q.detach())
            if single:
                checks(f"{label} step {step} {name} vs one process", p.detach(), s.detach())
        for (name, b), tb in zip(models["pt_dist"].named_buffers(), models["torch"].buffers()):
            checks(f"{label} step {step} buffer {name} vs torch DDP", b, tb)
    return ddps["pt_dist"]


class Block(nn.Module):
    """A residual MLP block (an FSDP unit in the tests); ``checkpointed``: its inside runs under non-reentrant
    activation checkpointing."""

    def __init__(self, width: int = 12, hidden: int = 20, checkpointed: bool = False):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.checkpointed = checkpointed

    def _inner(self, x):
        return self.down(torch.tanh(self.up(self.norm(x))))

    def forward(self, x):
        if self.checkpointed:
            return x + torch.utils.checkpoint.checkpoint(self._inner, x, use_reentrant=False)
        return x + self._inner(x)


def stack(blocks: int = 3, checkpointed: bool = False, width: int = 12):
    """In-projection, blocks of growing hidden sizes (so their flat parameters differ: 20, 24, ...), head; 3 outputs."""
    return nn.Sequential(nn.Linear(6, width), *[Block(width, 20 + 4 * k, checkpointed) for k in range(blocks)],
                         nn.Linear(width, 3))


def mse(model, x, y, rank):
    return torch.nn.functional.mse_loss(model(x), y)


def fully_shard_blocks(model, world, mesh_shape=None):
    """torch's FSDP2 on the same units: each Block, then the root. ``mesh_shape`` (replicas, shard size): HSDP, the
    shard groups consecutive ranks (rank // shard size), the replicate groups every shard size-th."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    shape = mesh_shape or (world,)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
    for m in model:
        if isinstance(m, Block):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train_fsdp_side_by_side(rank, world, checks, label, make_model=stack, steps=4, lr=1e-2, torch_fsdp2=True,
                            mesh_shape=None, reference=None, atol=None, group=None, **fsdp_kwargs):
    """pt_dist's FSDP (each Block a unit) vs one process on the whole batch (``reference(model, xs, ys)`` its step's
    loss, default: the mean of the slices' losses) vs torch's fully_shard, AdamW; parameters compared after every
    step through the gathered full state dict (``mesh_shape``: torch's on that mesh). Returns pt_dist's FSDP."""
    from pt_dist.fsdp import FullyShardedDataParallel, ModuleWrapPolicy

    torch.manual_seed(0)
    base = make_model()
    single, ours = copy.deepcopy(base), copy.deepcopy(base)
    fsdp = FullyShardedDataParallel(ours, process_group=group, auto_wrap_policy=ModuleWrapPolicy({Block}),
                                    **fsdp_kwargs)
    models = {"single": single, "pt_dist": fsdp}
    if torch_fsdp2:
        models["torch"] = fully_shard_blocks(copy.deepcopy(base), world, mesh_shape)
    opts = {k: torch.optim.AdamW(m.parameters(), lr=lr) for k, m in models.items()}
    for step in range(steps):
        xs, ys = batches(world, step)
        if reference is None:
            (sum(mse(single, xs[r], ys[r], r) for r in range(world)) / world).backward()
        else:
            reference(single, xs, ys)
        for name in models:
            if name != "single":
                mse(models[name], xs[rank], ys[rank], rank).backward()
        for opt in opts.values():
            opt.step()
            opt.zero_grad()
        full = fsdp.full_state_dict()
        theirs = {k: v.full_tensor() for k, v in models["torch"].state_dict().items()} if torch_fsdp2 else {}
        for name, p in single.state_dict().items():
            close = (lambda a, b: torch.allclose(a, b, atol=atol, rtol=0)) if atol else None
            checks(f"{label} step {step} {name} vs one process", full[name], p, close)
            if torch_fsdp2:
                checks(f"{label} step {step} {name} vs torch fully_shard", full[name], theirs[name])
    return fsdp


# -- torch's upstream DDP tests (test_ddp_upstream.py, test_ddp_hooks_upstream.py) ---------------------------------

class Task(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.ones(2, 2))

    def forward(self, x):
        return self.p + x
