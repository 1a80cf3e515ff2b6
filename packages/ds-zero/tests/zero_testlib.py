"""Shared helpers for ds-zero tests, loaded by path (tests run in importlib mode and in spawned ranks)."""

from __future__ import annotations

import contextlib

import torch

IN, HIDDEN, OUT = 8, 16, 4


@contextlib.contextmanager
def one_thread():
    """Ranks share two cores: one intra-op thread each avoids oversubscription (restored after, ranks are pooled)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class TinyMLP(torch.nn.Module):
    def __init__(self, hidden: int = HIDDEN, depth: int = 2):
        super().__init__()
        layers = [torch.nn.Linear(IN, hidden), torch.nn.Tanh()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(hidden, hidden), torch.nn.Tanh()]
        self.body = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(hidden, OUT)

    def forward(self, x):
        return self.head(self.body(x))


def make_model(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return TinyMLP(**kw)


def make_data(steps: int, global_batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, global_batch, IN, generator=g), torch.randn(steps, global_batch, OUT, generator=g)


def base_config(stage: int, world: int, micro: int = 4, gas: int = 1, **extra) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
           "train_batch_size": micro * gas * world, "gradient_clipping": 0.0,  # DeepSpeed's default is 1.0
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.01, "torch_adam": True}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 100, "allgather_bucket_size": 100,
                                 "stage3_prefetch_bucket_size": 200, "stage3_param_persistence_threshold": 10}}
    cfg.update(extra)
    return cfg


def rank_batches(x, y, step: int, rank: int, world: int, micro: int, gas: int):
    """The micro-batches rank ``rank`` sees at ``step``: global batch laid out [micro][rank]."""
    out = []
    for m in range(gas):
        lo = (m * world + rank) * micro
        out.append((x[step, lo:lo + micro], y[step, lo:lo + micro]))
    return out


def train_ds(engine, x, y, rank, world, micro, gas, dtype=None) -> list[float]:
    losses = []
    for s in range(x.shape[0]):
        total = 0.0
        for xb, yb in rank_batches(x, y, s, rank, world, micro, gas):
            if dtype is not None:
                xb, yb = xb.to(dtype), yb.to(dtype)
            loss = torch.nn.functional.mse_loss(engine(xb).float(), yb.float())
            engine.backward(loss)
            engine.step()
            total += loss.item() / gas
        losses.append(total)
    return losses


def train_reference(model, x, y, lr=1e-2, weight_decay=0.01, clip=0.0, opt="AdamW") -> list[float]:
    """The plain single-process run every stage must reproduce: whole global batch per step."""
    if opt == "AdamW":
        optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    else:
        optim = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for s in range(x.shape[0]):
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[s]), y[s])
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optim.step()
        losses.append(loss.item())
    return losses


def full_params(engine) -> dict:
    """Full fp32 copies of the engine's parameters (gathering ZeRO-3 ones)."""
    from ds_zero.zero import GatheredParameters

    params = list(engine.module.parameters())
    with GatheredParameters(params):
        return {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}


def mean_over_ranks(per_rank: list[list[float]]) -> list[float]:
    """Each rank's loss is the mean over its equal-sized shard, so the global loss is their mean."""
    return [sum(v) / len(v) for v in zip(*per_rank)]
