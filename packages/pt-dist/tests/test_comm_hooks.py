"""DDP comm hooks on tcp, shm and gloo: every built-in against DDP without a hook and against torch's same hook on
torch's DDP in the same ranks; PowerSGD (error feedback, warm start) converging like torch's; a user hook written
as torch's are, whose first all-reduce's callback waits on the second's ``then``-chained future."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as torch_default
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as torch_powersgd
from pt_dist.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))


def _grads(rank, model, group, hook=None, state=None, torch_ddp=False):
    model = copy.deepcopy(model)
    ddp = (torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.001)
           if torch_ddp else pt_dist.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.001))
    if hook is not None:
        ddp.register_comm_hook(group if state is None else state, hook)
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(rank))
    ddp(x).pow(2).mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def _two_halves_hook(process_group, bucket):
    """Average the bucket in two all-reduces, the second chained with then; the first's callback waits for it."""
    buffer = bucket.buffer()
    half = buffer.numel() // 2
    first = pt_dist.all_reduce(buffer[:half].div_(process_group.size()), group=process_group,
                               async_op=True).get_future()
    second = pt_dist.all_reduce(buffer[half:], group=process_group, async_op=True).get_future().then(
        lambda fut: fut.value()[0].div_(process_group.size()))
    return first.then(lambda fut: (second.wait(), buffer)[1])


def _close(a, b, rtol, atol):
    return all(torch.allclose(x, y, rtol=rtol, atol=atol) for x, y in zip(a, b))


def _hooks(rank, world, backend):
    util.join(rank, world, backend, timeout=30)
    try:
        group, torch_pg = pt_dist.group.WORLD, torch.distributed.group.WORLD
        model, out = _model(), {}
        plain = _grads(rank, model, group)
        torch_plain = _grads(rank, model, torch_pg, torch_ddp=True)
        out["no hook vs torch"] = _close(plain, torch_plain, 1e-6, 1e-7)
        for name, tol in (("allreduce_hook", 1e-6), ("fp16_compress_hook", 2e-3), ("bf16_compress_hook", 2e-2)):
            ours = _grads(rank, model, group, getattr(default_hooks, name))
            theirs = _grads(rank, model, torch_pg, getattr(torch_default, name), torch_ddp=True)
            out[f"{name} vs no hook"] = _close(ours, plain, tol, tol * 1e-2)
            out[f"{name} vs torch's"] = _close(ours, theirs, 1e-6, 1e-7)
        wrapped = _grads(rank, model, group, default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook))
        out["fp16 wrapper = fp16 hook"] = _close(wrapped, _grads(rank, model, group, default_hooks.fp16_compress_hook),
                                                 0, 0)
        out["then-chained user hook vs no hook"] = _close(_grads(rank, model, group, _two_halves_hook), plain, 1e-6,
                                                          1e-7)
        out["buckets"] = len(pt_dist.DistributedDataParallel(copy.deepcopy(model), bucket_cap_mb=0.001).reducer
                             ._buckets)
        out["powersgd"] = _powersgd(rank, group, torch_pg)
        return out
    finally:
        util.leave()


def _powersgd(rank, group, torch_pg):
    """Regression onto a rank-3 map with 48x48 weights: PowerSGD at rank 2 from iteration 3, ours and torch's."""
    g = torch.Generator().manual_seed(7)
    target = torch.randn(48, 3, generator=g) @ torch.randn(3, 48, generator=g) / 4
    losses, states, weights = {}, {}, {}
    for name in ("pt_dist", "torch"):
        torch.manual_seed(0)
        model = nn.Linear(48, 48, bias=False)
        if name == "pt_dist":
            state = powerSGD_hook.PowerSGDState(group, matrix_approximation_rank=2, start_powerSGD_iter=3)
            ddp = pt_dist.DistributedDataParallel(model)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        else:
            state = torch_powersgd.PowerSGDState(torch_pg, matrix_approximation_rank=2, start_powerSGD_iter=3)
            ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=torch_pg)
            ddp.register_comm_hook(state, torch_powersgd.powerSGD_hook)
        opt = torch.optim.SGD(model.parameters(), lr=3.0)
        losses[name] = []
        for step in range(60):
            x = torch.randn(16, 48, generator=torch.Generator().manual_seed(100 * step + rank))
            loss = (ddp(x) - x @ target.T).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[name].append(loss.item())
        states[name], weights[name] = state, model.weight.detach().clone()
    ours = states["pt_dist"]
    return {"losses": losses, "error feedback": sorted(ours.error_dict), "warm P": sorted(ours.p_memory_dict),
            "rate": ours.compression_stats()[0], "iter": ours.iter, "weight": weights["pt_dist"]}


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_builtin_hooks_match_no_hook_and_torchs_and_powersgd_converges(backend):
    results = run_ranks(_hooks, 2, backend, backend=None if backend == "gloo" else "gloo", timeout=120)
    for out in results:
        assert out["buckets"] >= 2
        assert all(v for k, v in out.items() if k not in ("buckets", "powersgd")), out
        sgd = out["powersgd"]
        ours, theirs = sgd["losses"]["pt_dist"], sgd["losses"]["torch"]
        assert ours[-1] < 0.05 * ours[0] and theirs[-1] < 0.05 * theirs[0], (ours[::10], theirs[::10])
        assert ours[-1] < 2 * theirs[-1] + 1e-4, (ours[-5:], theirs[-5:])
        assert sgd["error feedback"] == sgd["warm P"] == [0] and sgd["iter"] == 60 and sgd["rate"] > 4
    assert torch.equal(results[0]["powersgd"]["weight"], results[1]["powersgd"]["weight"])  # replicas agree
