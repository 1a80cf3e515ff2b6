"""torch's own DDP comm-hook tests, ported to pt_dist: test/distributed/algorithms/ddp_comm_hooks/test_ddp_hooks.py
(allreduce, fp16, noop and is_last hooks), test/distributed/test_c10d_gloo.py's comm-hook future-passing and
hook-checking cases and test_c10d_common.py's ``test_invalid_powerSGD_state``. Adapted: CPU modules; the checks run
inside spawned ranks and come back as a list of failures; test_ddp_hooks' is_last model is 400 wide instead of
4000."""

from __future__ import annotations

import sys
from itertools import product
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist.algorithms.ddp_comm_hooks import default_hooks
from pt_dist.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from pt_dist.nn.parallel import DistributedDataParallel, GradBucket
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import ddp_testutil as dutil  # noqa: E402
import upstream_cases  # noqa: E402


def test_invalid_powerSGD_state():  # noqa: N802 - torch's name
    for start, error_feedback, warm_start in product([0, 1], [True, False], [True, False]):
        if not error_feedback and not warm_start:
            continue
        with pytest.raises(ValueError, match="Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or "
                                             "`warm_start` is enabled, because PowerSGD can only be applied after "
                                             "the first two iterations in DDP."):
            powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=start,
                                   use_error_feedback=error_feedback, warm_start=warm_start)


class ModuleForDdpCommHook(nn.Module):
    def __init__(self):
        super().__init__()
        self.t0 = dutil.Task()

    def forward(self, x, rank):
        return self.t0(x + rank)


def comm_hook_checks(c, pg):
    def simple_hook(state, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut = torch.futures.Future()
        fut.set_result(torch.ones_like(bucket.buffer()))
        return fut.then(lambda fut: fut.value() + torch.ones_like(fut.value()))

    model = DistributedDataParallel(ModuleForDdpCommHook(), process_group=pg)
    model.register_comm_hook(None, simple_hook)  # test_ddp_comm_hook_future_passing_cpu
    model(8, c.rank).mean().backward()
    c.equal("future passing", next(model.parameters()).grad, 2 * torch.ones(2, 2), rtol=0, atol=0)

    model = DistributedDataParallel(ModuleForDdpCommHook(), process_group=pg)  # test_ddp_invalid_comm_hook_init
    with pytest.raises(TypeError, match="Communication hook must be callable."):
        model.register_comm_hook(state=None, hook=1)

    def bad_bucket(state: object, bucket: int) -> torch.futures.Future[torch.Tensor]:
        return torch.futures.Future()
    with pytest.raises(ValueError, match="bucket annotation should be dist.GradBucket."):
        model.register_comm_hook(state=None, hook=bad_bucket)

    def bad_return(state: object, bucket: GradBucket) -> int:  # test_ddp_invalid_comm_hook_return_type
        return torch.futures.Future()
    with pytest.raises(ValueError, match="Communication hook: return annotation should be torch.futures.Future"):
        model.register_comm_hook(state=None, hook=bad_return)
    with pytest.raises(RuntimeError, match="callback must return a torch.futures.Future object, but got"):
        model.register_comm_hook(state=None, hook=lambda state, bucket: 1)
        model(8, c.rank).mean().backward()

    def dummy_hook(state, bucket):
        fut = torch.futures.Future()
        fut.set_result([bucket.buffer()])
        return fut
    model = DistributedDataParallel(ModuleForDdpCommHook(), process_group=pg)  # register_just_once
    model.register_comm_hook(None, dummy_hook)
    with pytest.raises(RuntimeError, match="register_comm_hook or register_builtin_comm_hook can only be called "
                                           "once."):
        model.register_comm_hook(None, dummy_hook)


def ddp_hooks_file(c, pg):
    """test_ddp_hooks.py's DistributedDataParallelCommHookTest."""
    class HookTask(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.p = nn.Parameter(torch.randn(40, 20))

        def forward(self, x):
            return self.p * x

    class TestDdpCommHook(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0 = HookTask()

        def forward(self, x, rank):
            return self.t0(x ** (1 + rank))

    def grads(hook=None):
        model = DistributedDataParallel(TestDdpCommHook(), process_group=pg)
        if hook is not None:
            model.register_comm_hook(pg, hook)
        torch.manual_seed(2020)
        model(torch.randn(40, 20), c.rank).mean().backward()
        return next(model.parameters()).grad

    def noop(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    reference = grads()
    c.equal("allreduce hook", grads(default_hooks.allreduce_hook), reference, rtol=1e-5, atol=0)
    c.equal("fp16 hook", grads(default_hooks.fp16_compress_hook), reference, rtol=1e-5, atol=1e-4)
    summed = grads(noop).div_(c.world_size)
    pt_dist.all_reduce(summed, group=pg)
    c.equal("noop hook then all-reduce", summed, reference, rtol=1e-5, atol=0)

    flags = []

    def is_last(state, bucket):
        state.append(bucket.is_last())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    model = DistributedDataParallel(nn.Sequential(nn.Linear(2, 400, bias=False),
                                                  *[nn.Linear(400, 400, bias=False) for _ in range(10)]),
                                    process_group=pg, bucket_cap_mb=1)
    model.register_comm_hook(state=flags, hook=is_last)
    model(torch.randn(10, 2)).sum().backward()
    c.true(f"is_last flags {flags}", len(flags) > 2 and flags[-1] and not any(flags[:-1]))


CASES = (comm_hook_checks, ddp_hooks_file)


@upstream_cases.parametrize(CASES, expect=2, backends=("tcp", "shm", "gloo"))
def test_upstream_comm_hook_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=240)
