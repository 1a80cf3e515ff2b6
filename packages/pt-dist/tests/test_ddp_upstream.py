"""torch's own DDP tests, ported to pt_dist: test/distributed/test_c10d_common.py (ComputeBucketAssignmentTest,
CommonDistributedDataParallelTest's ``_test_ddp_with_process_group``, the ``_test_ddp_checkpointing`` cases,
the dataclass-output and batch-norm multi-forward cases), torch/testing/_internal/distributed/distributed_test.py
(test_ddp_broadcast_buffer), test/distributed/
test_c10d_gloo.py (DistributedDataParallelTest's unused-parameter, ignored-output and save/load cases; ReducerTest).
The comm-hook cases are in test_ddp_hooks_upstream.py. Adapted: CPU modules; the checks run inside spawned ranks
and come back as a list of failures."""

from __future__ import annotations

import copy
import os
import random
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import groupby, product
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.nn.functional as F
from pt_dist.nn.parallel import DistributedDataParallel, Reducer
from pt_dist.nn.parallel.bucketing import _DEFAULT_FIRST_BUCKET_BYTES, _compute_bucket_assignment_by_size
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import ddp_testutil as dutil  # noqa: E402
import upstream_cases  # noqa: E402

# -- ComputeBucketAssignmentTest -------------------------------------------------------------------------------

def test_single_limit_single_dtype():
    tensors = [torch.empty([100]), torch.empty([200]), torch.empty([100]), torch.empty([50])]
    result, limits = _compute_bucket_assignment_by_size(tensors, [400])
    assert all(lim == 400 for lim in limits) and result == [[0], [1], [2], [3]]


def test_single_limit_multi_dtype():
    tensors = [torch.empty([50]), torch.empty([25], dtype=torch.double)] * 3
    result, limits = _compute_bucket_assignment_by_size(tensors, [400])
    assert all(lim == 400 for lim in limits) and result == [[0, 2], [1, 3], [4], [5]]


def test_multi_limit_single_dtype():
    result, limits = _compute_bucket_assignment_by_size([torch.empty([10])] * 4, [40, 80])
    assert limits == [40, 80, 80] and result == [[0], [1, 2], [3]]


def test_multi_limit_multi_dtype():
    tensors = [torch.empty([50]), torch.empty([25], dtype=torch.double)] * 3
    result, limits = _compute_bucket_assignment_by_size(tensors, [200, 400])
    assert result == [[0], [1], [2, 4], [3, 5]] and limits == [200, 200, 400, 400]


# -- models of test_c10d_common.py / test_c10d_gloo.py ---------------------------------------------------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(2, 10, bias=False), nn.Linear(10, 50, bias=False), nn.Linear(
            50, 4, bias=False)

    def forward(self, x):
        return F.softmax(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), dim=1)


class CheckpointOnceModule(nn.Module):
    def __init__(self, use_reentrant=True):
        super().__init__()
        self.l1, self.l2, self.use_reentrant = nn.Linear(20, 20), nn.Linear(20, 20), use_reentrant

    def forward(self, inp):
        return checkpoint(self.l2, self.l1(inp), use_reentrant=self.use_reentrant)


class CheckpointTwiceModule(CheckpointOnceModule):
    def forward(self, inp):
        x = checkpoint(self.l2, self.l1(inp), use_reentrant=self.use_reentrant)
        return checkpoint(self.l2, x, use_reentrant=self.use_reentrant)


class CheckpointTwiceModuleWeightSharing(CheckpointTwiceModule):
    def __init__(self, use_reentrant=True):
        super().__init__(use_reentrant)
        self.l1.weight = self.l2.weight


class DynamicCheckpointTwiceModule(CheckpointTwiceModule):
    def __init__(self, use_reentrant=True):
        super().__init__(use_reentrant)
        self.count = 0

    def forward(self, inp):
        layer = self.l1 if self.count % 2 else self.l2
        self.count += 1
        return checkpoint(layer, inp, use_reentrant=self.use_reentrant)


class DynamicCheckpointTwiceModuleWeightSharing(DynamicCheckpointTwiceModule):
    def __init__(self, use_reentrant=True):
        super().__init__(use_reentrant)
        self.l1.weight = self.l2.weight


@dataclass
class CustomOutput:
    o1: torch.Tensor | None
    o2: dict


class DataclassOutputModule(nn.Module):
    def __init__(self, skip_o1):
        super().__init__()
        self.seq1 = nn.Sequential(*[nn.Linear(10, 10) for _ in range(3)])
        self.seq2 = nn.Sequential(*[nn.Linear(10, 10) for _ in range(3)])
        self.skip_o1 = skip_o1

    def forward(self, x):
        o1 = None if self.skip_o1 else F.relu(self.seq1(x))
        return CustomOutput(o1=o1, o2={"a": self.seq2(x), "b": F.relu(self.seq2(x))})


class ReducerModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(2, 10, bias=False), nn.Linear(10, 4, bias=False), nn.Linear(
            4, 4, bias=False)

    def forward(self, x, use_fc3=True):
        x = F.relu(self.fc2(F.relu(self.fc1(x)).float())).float()
        if use_fc3:
            x = self.fc3(x).float()
        return F.softmax(x, dim=1)


# -- the cases (each takes the _Case and the group) ------------------------------------------------------------

def ddp_with_process_group(c, pg):
    for view in (False, True):
        torch.manual_seed(1337)
        model = Net()
        ddp = DistributedDataParallel(copy.deepcopy(model), process_group=pg, bucket_cap_mb=0.001,
                                      gradient_as_bucket_view=view)
        batch = c.world_size
        inp, target = torch.randn(batch, 2), torch.randn(batch, 4)
        for iteration in range(2):
            for m, x, y in ((model, inp, target), (ddp, inp[c.rank:c.rank + 1], target[c.rank:c.rank + 1])):
                F.mse_loss(m(x), y).backward()
                for p in m.parameters():
                    with torch.no_grad():
                        p -= p.grad
                    p.grad = None
            for i, j in zip(model.parameters(), ddp.parameters()):
                c.equal(f"_test_ddp_with_process_group view={view} iteration {iteration}", i, j)
            torch.manual_seed(1337 + iteration)
            inp = inp[torch.randperm(batch)]


def _ddp_checkpointing(c, pg, input_model, use_bucket_view, find_unused_parameters=False, static_graph=False,
                       run_checkpoint=False, use_reentrant=True, allow_none_grads=False):
    torch.manual_seed(31415)
    model, ddp_model = copy.deepcopy(input_model), copy.deepcopy(input_model)
    ddp_model = DistributedDataParallel(ddp_model, bucket_cap_mb=1, gradient_as_bucket_view=use_bucket_view,
                                        process_group=pg, find_unused_parameters=find_unused_parameters,
                                        static_graph=static_graph)
    c.true("static_graph logged", ddp_model._get_ddp_logging_data().get("static_graph", 0) == static_graph)
    bs = 16 * c.world_size
    inp, target = torch.rand((bs, 20), requires_grad=True), torch.randn((bs, 20))
    ddp_inp, ddp_target = inp[c.rank * 16:(c.rank + 1) * 16], target[c.rank * 16:(c.rank + 1) * 16]
    for _ in range(5):
        model.zero_grad(set_to_none=False)
        ddp_model.zero_grad(set_to_none=False)
        for m, x, y in ((model, inp, target), (ddp_model, ddp_inp, ddp_target)):
            m.train()
            out = checkpoint(m, x, use_reentrant=use_reentrant) if run_checkpoint else m(x)
            nn.MSELoss()(out, y).backward()
        for i, j in zip(model.parameters(), ddp_model.parameters()):
            if not allow_none_grads:
                c.true("grads present", i.grad is not None and j.grad is not None)
            c.equal(f"checkpointing {type(input_model).__name__}", i.grad, j.grad)


def _raises_marked_twice(c, reentrant):
    return pytest.raises(RuntimeError, match="Expected to mark a variable ready only once.") if reentrant \
        else nullcontext()


def ddp_checkpointing_cases(c, pg):
    for reentrant in (True, False):
        for view, static in product((False, True), (False, True)):  # test_ddp_checkpointing_once
            _ddp_checkpointing(c, pg, CheckpointOnceModule(reentrant), view, static_graph=static)
            if static:
                _ddp_checkpointing(c, pg, CheckpointOnceModule(), view, static_graph=static,
                                   find_unused_parameters=True)
        for view in (True, False):
            with _raises_marked_twice(c, reentrant):  # test_ddp_checkpointing_unused_params
                _ddp_checkpointing(c, pg, CheckpointOnceModule(reentrant), view, find_unused_parameters=True)
            _ddp_checkpointing(c, pg, CheckpointOnceModule(reentrant), view, find_unused_parameters=True,
                               static_graph=True)
            with _raises_marked_twice(c, reentrant):  # test_ddp_checkpointing_twice
                _ddp_checkpointing(c, pg, CheckpointTwiceModule(reentrant), view)
            with _raises_marked_twice(c, reentrant):
                _ddp_checkpointing(c, pg, CheckpointTwiceModule(reentrant), view, find_unused_parameters=True)
            _ddp_checkpointing(c, pg, CheckpointTwiceModule(reentrant), view, static_graph=True)  # twice_static
        for view, static in product((False, True), (False, True)):  # test_ddp_checkpointing_weight_sharing
            torch.manual_seed(31415)
            l1, l2 = nn.Linear(20, 20), nn.Linear(20, 20)
            l1.weight = l2.weight
            _ddp_checkpointing(c, pg, nn.Sequential(l1, l2), view, static_graph=static, run_checkpoint=True,
                               use_reentrant=reentrant)
    for view in (True, False):
        for module in (DynamicCheckpointTwiceModule, DynamicCheckpointTwiceModuleWeightSharing):  # dynamic_*
            _ddp_checkpointing(c, pg, module(use_reentrant=False), view, find_unused_parameters=True,
                               allow_none_grads=True)
        _ddp_checkpointing(c, pg, CheckpointTwiceModuleWeightSharing(), view, static_graph=True)


def global_local_unused_params_grad(c, pg):
    class GlobalLocalUnusedParamModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0, self.t1, self.task_unused = dutil.Task(), dutil.Task(), dutil.Task()

        def forward(self, x, rank):
            return self.t0(x) if rank == 0 else self.t1(x)

    for view, static in ((False, False), (True, False), (False, True)):
        model = DistributedDataParallel(GlobalLocalUnusedParamModule(), process_group=pg, find_unused_parameters=True,
                                        gradient_as_bucket_view=view, static_graph=static)
        output = model(8, c.rank)
        m = model.module
        c.true("grads None before backward", m.t0.p.grad is None and m.t1.p.grad is None)
        output.mean().backward()
        c.true(f"locally unused params get grads (view={view}, static={static})",
               m.t0.p.grad is not None and m.t1.p.grad is not None)
        c.true("the globally unused param's grad stays None", m.task_unused.p.grad is None)


def find_unused_parameters_when_unused_parameters_empty(c, pg):
    class FindUnusedParamModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.t0, self.t1 = dutil.Task(), dutil.Task()

        def forward(self, x, rank):
            return self.t1(self.t0(x)) if rank == 0 else self.t1(x)

    model = DistributedDataParallel(FindUnusedParamModule(), process_group=pg, find_unused_parameters=True)
    model(8, c.rank).mean().backward()
    c.true("every param has a grad", all(p.grad is not None for p in model.parameters()))


def ignored_output(c, pg):
    for find_unused in (False, True):
        class IgnoredOutput(nn.Module):
            def __init__(self, spare):
                super().__init__()
                self.fc1, self.fc2 = nn.Linear(2, 10, bias=False), nn.Linear(10, 4, bias=False)
                if spare:
                    self.fc3 = nn.Linear(4, 4, bias=False)

            def forward(self, x):
                return F.softmax(F.relu(self.fc2(F.relu(self.fc1(x)))), dim=1)

        model = DistributedDataParallel(IgnoredOutput(find_unused).float(), process_group=pg,
                                        find_unused_parameters=find_unused)
        inp = torch.rand([4, 2])
        target = torch.LongTensor([random.randrange(4) for _ in range(4)])
        for _ in range(4):
            output = model(inp)
            del output
        for _ in range(4):
            nn.CrossEntropyLoss()(model(inp), target).backward()
        c.true("ignored outputs then training", model.module.fc1.weight.grad is not None)


def dataclass_output(c, pg):
    for skip_o1 in (False, True):
        net_x = torch.cat([torch.ones(4, 10) * i for i in range(c.world_size)])
        ddp_x = torch.ones(4, 10) * c.rank
        torch.manual_seed(0)
        net = DataclassOutputModule(skip_o1)
        ddp = DistributedDataParallel(copy.deepcopy(net), find_unused_parameters=True, process_group=pg)

        def loss(out, x, skip_o1=skip_o1):
            s = out.o2["a"] + out.o2["b"] if skip_o1 else out.o1 + out.o2["a"] + out.o2["b"]
            return F.mse_loss(s, torch.ones_like(out.o2["a"]))
        loss(net(net_x), net_x).backward()
        loss(ddp(ddp_x), ddp_x).backward()
        for p1, p2 in zip(net.parameters(), ddp.parameters()):
            c.equal(f"dataclass output skip_o1={skip_o1}", p1.grad, p2.grad, rtol=1e-5, atol=1e-8)


def buffer_sync_multi_forward_with_batchnorm(c, pg):
    model = DistributedDataParallel(nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(10)), process_group=pg,
                                    broadcast_buffers=True)
    x = torch.randn(4, 10)
    model.zero_grad()
    (model(x).mean() + model(x).mean()).backward()
    c.true("two forwards, one backward", model.module[0].weight.grad is not None)


def save_load_checkpoint(c, pg):
    path = os.path.join(c.scratch, "model.checkpoint")
    class TestModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(2, 10, bias=False), nn.Linear(10, 4, bias=False)

        def forward(self, x):
            return F.softmax(F.relu(self.fc2(F.relu(self.fc1(x)))), dim=1)

    def train_loop(model, optimizer, iterations):
        for _ in range(iterations):
            optimizer.zero_grad()
            nn.CrossEntropyLoss()(model(inp), target).backward()
            optimizer.step()

    model_withload, model_withoutload = TestModel().float(), TestModel().float()
    ddp_withload = DistributedDataParallel(model_withload, process_group=pg)
    ddp_withoutload = DistributedDataParallel(model_withoutload, process_group=pg)
    for m in (ddp_withload, model_withload, ddp_withoutload):
        for p in m.parameters():
            with torch.no_grad():
                p.zero_()
    opt_withload = torch.optim.SGD(ddp_withload.parameters(), lr=0.001)
    opt_non_ddp = torch.optim.SGD(model_withload.parameters(), lr=0.001)
    opt_withoutload = torch.optim.SGD(ddp_withoutload.parameters(), lr=0.001)
    inp = torch.rand([4, 2])
    target = torch.LongTensor([random.Random(c.rank).randrange(4) for _ in range(4)])
    train_loop(ddp_withload, opt_withload, 3)
    if c.rank == 0:
        torch.save(ddp_withload.state_dict(), path)
    pt_dist.barrier(group=pg)
    state = torch.load(path)
    for p in ddp_withload.parameters():
        with torch.no_grad():
            p.zero_()
    ddp_withload.load_state_dict(state)
    torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, "module.")
    model_withload.load_state_dict(state)
    train_loop(ddp_withload, opt_withload, 3)
    train_loop(model_withload, opt_non_ddp, 3)
    train_loop(ddp_withoutload, opt_withoutload, 6)
    for a, b, d in zip(ddp_withload.parameters(), ddp_withoutload.parameters(), model_withload.parameters()):
        c.equal("save/load", a, b, rtol=0, atol=0)
        c.equal("save/load non-DDP", d, b, rtol=0, atol=0)


def reducer_cases(c, pg):
    """test_c10d_gloo.py's ReducerTest on a world-1 group."""
    pg = pt_dist.new_group([c.rank], use_local_synchronization=True)

    def mixed():
        model = ReducerModule().float()
        model.fc1.double()
        return model

    def reducer(model, find_unused_parameters=False):
        params = list(model.parameters())
        buckets = [list(idx) for _, idx in groupby(range(len(params)), key=lambda i: params[i].dtype)]
        return Reducer(params, buckets, [_DEFAULT_FIRST_BUCKET_BYTES] * len(buckets), pg,
                       find_unused_parameters=find_unused_parameters)

    model = ReducerModule()
    Reducer(list(model.parameters()), [[0, 1, 2]], [_DEFAULT_FIRST_BUCKET_BYTES], pg)  # single dtype, one bucket
    with pytest.raises(RuntimeError):  # multi dtype, one bucket
        Reducer(list(mixed().parameters()), [[0, 1, 2]], [_DEFAULT_FIRST_BUCKET_BYTES], pg)
    reducer(mixed())  # multi dtype, multi bucket
    for find_unused, use_fc3 in ((False, True), (True, False)):  # test_forward_backward(_unused_parameters)
        model = mixed()
        r = reducer(model, find_unused)
        r.prepare_for_forward()
        output = nn.CrossEntropyLoss()(model(torch.rand([10, 2], dtype=torch.double), use_fc3),
                                       torch.LongTensor([random.randrange(4) for _ in range(10)]))
        r.prepare_for_backward(output)
        output.backward()
        c.true(f"forward/backward fc3 grad (find_unused={find_unused})",
               (model.fc3.weight.grad is None) == (not use_fc3) and model.fc1.weight.grad is not None)
    model = mixed()  # test_forward_backward_optimizer
    r = reducer(model, find_unused_parameters=True)
    optimizer = torch.optim.Adam(model.parameters())
    for i in range(3):
        optimizer.zero_grad()
        output = nn.CrossEntropyLoss()(model(torch.rand([10, 2], dtype=torch.double), use_fc3=(i > 0)),
                                       torch.LongTensor([random.randrange(4) for _ in range(10)]))
        r.prepare_for_backward(output)
        output.backward()
        optimizer.step()
    c.true("optimizer steps through the reducer", model.fc3.weight.grad is not None)


def broadcast_reassigned_buffer(c, pg):
    """torch/testing/_internal/distributed/distributed_test.py::test_ddp_broadcast_buffer: rank 0 replaces its
    buffer with a new tensor before each forward; DDP broadcasts the module's current buffers, not the tensors
    it found at construction."""
    class NetWithBuffers(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(10, 10, bias=False), nn.Linear(10, 1, bias=False)
            self.register_buffer("buffer", torch.randn(1, 2))

        def forward(self, x):
            return self.b(self.a(x))

    torch.manual_seed(c.rank)
    model_ddp = DistributedDataParallel(NetWithBuffers(), process_group=pg)
    inp = torch.randn(2, 10)
    for _ in range(2):
        if c.rank == 0:
            model_ddp.module.buffer = model_ddp.module.buffer + 1
        model_ddp(inp).sum().backward()
        bufs = [torch.empty_like(model_ddp.module.buffer) for _ in range(pg.size())]
        pt_dist.all_gather(bufs, model_ddp.module.buffer, group=pg)
        for buf in bufs[1:]:
            c.equal("reassigned buffer broadcast", bufs[0], buf, rtol=0, atol=0)


CASES = (ddp_with_process_group, ddp_checkpointing_cases, global_local_unused_params_grad,
         find_unused_parameters_when_unused_parameters_empty, ignored_output, dataclass_output,
         buffer_sync_multi_forward_with_batchnorm, broadcast_reassigned_buffer, save_load_checkpoint, reducer_cases)


@upstream_cases.parametrize(CASES, expect=10, backends=("tcp", "shm", "gloo"))
def test_upstream_ddp_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=240, seed=0)  # (as upstream's setUp: every rank, every test)
