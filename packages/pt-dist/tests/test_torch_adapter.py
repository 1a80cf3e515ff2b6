"""The torch-backed adapters ("gloo", "nccl", "mpi"): pt_dist's API on torch's real process groups, checked
against torch's own calls in the same ranks (NCCL in ``gpu``-marked tests)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError, ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _gloo_groups(rank, world_size):
    util.join(rank, world_size, "gloo", key="gloo_groups")
    import torch.distributed as dist

    sub = pt_dist.new_group([0, 1])
    t = torch.tensor([rank + 1.0])
    pt_dist.all_reduce(t, op=ReduceOp.AVG, group=sub)  # gloo has no AVG: the adapter emulates it
    w = pt_dist.all_reduce(torch.ones(2), async_op=True)
    w.wait()
    same = dist.is_initialized() and dist.get_world_size() == world_size  # torch-native code sees the group
    # polled, not waited: complete means the emulated AVG's division (and a copy-back) is done too
    avg = torch.full((3, 2), float(rank + 1)).t()
    polled = pt_dist.all_reduce(avg, op=ReduceOp.AVG, async_op=True)
    while not polled.is_completed():
        time.sleep(0.001)
    top = torch.tensor([float(rank)])
    pt_dist.all_reduce(top, op=dist.ReduceOp(dist.ReduceOp.MAX))  # an instance of torch's class, as torch takes
    # a wait that runs out leaves the Work pending, as torch's (it failed it for good, AVG's division never ran);
    # threads waiting at once finish it once (the second to finish raised, and failed it for good too)
    if rank == 1:
        time.sleep(0.5)
    late = torch.full((2,), float(rank + 1))
    lw = pt_dist.all_reduce(late, op=ReduceOp.AVG, async_op=True)
    ran_out = None
    if rank == 0:
        with pytest.raises(pt_dist.DistError, match="timed out"):
            lw.wait(timeout=0.05)
        ran_out = not lw.is_completed()
    errors = []

    def wait():
        try:
            lw.wait()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=wait) for _ in range(4)]
    [th.start() for th in threads]
    [th.join(30) for th in threads]
    # bad arguments raise on the rank that got them, before any communication, as on the native backends (an
    # expanded output failed after the collective, a list as AttributeError, a send to itself inside gloo)
    with pytest.raises(TypeError, match="all_reduce: tensor must be a torch.Tensor, got list"):
        pt_dist.all_reduce([1.0])
    with pytest.raises(ValueError, match="broadcast: tensor has elements that share memory"):
        pt_dist.broadcast(torch.zeros(1).expand(4), src=0)
    with pytest.raises(ValueError, match=f"send: dst={rank} is this rank"):
        pt_dist.send(torch.ones(1), dst=rank)
    # torch's own DDP on a sub-group's torch group (the README's recipe)
    model = torch.nn.Linear(2, 1)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=sub.pg)
    ddp(torch.full((1, 2), float(rank + 1))).sum().backward()
    util.leave()
    return (t.item(), same, w.is_completed(), avg.tolist(), top.item(), ran_out, errors, lw.wait() and lw.is_success(),
            late.tolist(), model.weight.grad.tolist())


def test_gloo_adapter_uses_the_real_torch_group():
    avg = [[1.5] * 3] * 2
    want = (1.5, True, True, avg, 1.0, True, [], True, [1.5, 1.5], [[1.5, 1.5]])
    assert run_ranks(_gloo_groups, 2, backend=None, timeout=90) == [want, want[:5] + (None,) + want[6:]]


def _stranger_on_the_adapters_store(rank, world_size):
    """A stranger who can reach the port torch's group rendezvoused on tries to rewrite a key there."""
    import datetime

    import torch.distributed as dist
    from pt_dist import DistNetworkError, TCPStore

    util.join(rank, world_size, "gloo", key="gloo_store")
    store = dist.distributed_c10d._get_default_store()
    while not hasattr(store, "port"):  # torch's prefixes, then (with the fix) our view and our prefixes
        store = getattr(store, "underlying_store", None) or store._store
    host, port = store.host, store.port
    wrote = refused_derived = None
    if rank == 0:
        try:  # torch's own client, as anyone runs it: c10d's TCPStore takes every connection
            stranger = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=3),
                                     wait_for_workers=False)
            stranger.set("intruder", "rewrote a key")
            wrote = True
        except Exception:  # noqa: BLE001 - refused, however it says so
            wrote = False
        try:  # ours, with the secret once derived from the address
            TCPStore(host, port, timeout=3, secret=f"pt_dist-rendezvous:{host}:{port}")
            refused_derived = False
        except DistNetworkError:
            refused_derived = True
    t = torch.ones(2)
    pt_dist.all_reduce(t)
    util.leave()
    return wrote, refused_derived, t.tolist()


def test_the_adapters_rendezvous_through_the_authenticated_store_not_an_open_c10d_one():
    """They used a c10d TCPStore of their own, which has no authentication: a stranger rewrote a key in it."""
    out = run_ranks(_stranger_on_the_adapters_store, 2, backend=None, timeout=90)
    assert out == [(False, True, [2.0, 2.0]), (None, None, [2.0, 2.0])]


def test_mpi_backend_says_clearly_when_torch_lacks_it():
    import torch.distributed as dist

    if dist.is_mpi_available():  # a torch built with MPI: the adapter must then get past the check
        from pt_dist._compat.torch_adapter import check_available

        check_available("mpi")
        return
    with pytest.raises(DistError, match="needs a torch build with MPI support"):
        pt_dist.init_process_group("mpi", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    assert not pt_dist.is_initialized()


def _nccl(rank, world_size):
    util.join(rank, world_size, "nccl", key="nccl")
    dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.full((1000,), float(rank), device=dev)
    pt_dist.all_reduce(t, op=ReduceOp.AVG)
    out = torch.empty(2 * 1000, device=dev)
    pt_dist.all_gather_into_tensor(out, torch.full((1000,), float(rank), device=dev))
    rs = torch.empty(1000, device=dev)
    pt_dist.reduce_scatter_tensor(rs, torch.ones(2000, device=dev))
    objs = [None, None]  # the object collectives move their bytes as CUDA tensors under NCCL
    pt_dist.all_gather_object(objs, {"rank": rank})
    pt_dist.barrier(device_ids=[torch.cuda.current_device()])
    util.leave()
    return t[0].item(), out.view(2, -1)[:, 0].tolist(), rs[0].item(), objs


@pytest.mark.gpu(2)
def test_nccl_adapter_on_gpus():
    assert run_ranks(_nccl, 2, backend=None, timeout=120) == [(0.5, [0.0, 1.0], 2.0, [{"rank": 0}, {"rank": 1}])] * 2


def _nccl_alone(rank, world_size):
    """One GPU: a one-rank NCCL communicator still runs every call through the adapter and the library."""
    util.join(rank, world_size, "nccl", key="nccl1", device_id=torch.device("cuda", 0))  # torch's eager-init form
    dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.arange(6, dtype=torch.float32, device=dev).view(2, 3).t()  # non-contiguous: staged and copied back
    pt_dist.all_reduce(t, op=ReduceOp.AVG)
    work = pt_dist.all_reduce(torch.ones(4, device=dev), op=ReduceOp.MAX, async_op=True)
    got = work.get_future().wait()[0]
    out = torch.empty(3, dtype=torch.bfloat16, device=dev)
    pt_dist.all_gather_into_tensor(out, torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16, device=dev))
    util.leave()
    return t.cpu().tolist(), got.cpu().tolist(), out.float().cpu().tolist()


@pytest.mark.gpu(1)
def test_nccl_adapter_on_one_gpu():
    assert run_ranks(_nccl_alone, 1, backend=None, timeout=120) == [
        ([[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]], [1.0] * 4, [1.0, 2.0, 3.0])]
