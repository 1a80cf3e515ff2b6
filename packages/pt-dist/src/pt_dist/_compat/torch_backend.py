"""pt-dist's own backends as ``torch.distributed`` backends: ``init_process_group("pt_shm")`` / ``("pt_tcp")``.

torch lets a backend be a Python ``ProcessGroup`` (``Backend.register_backend(name, creator)``; its own
``threaded`` test backend in ``torch/testing/_internal/distributed/multi_threaded_pg.py`` is one). Each method
below takes torch's calling convention (tensor lists, ``AllreduceOptions`` and friends), runs the pt-dist
group's collective with ``async_op=True`` and hands torch a ``Work`` made from that Work's future
(``_create_work_from_future``), so torch's ``DistributedDataParallel``, FSDP, ``DistributedSampler`` and
``torch.distributed.get_rank()`` run on pt-dist's shared-memory or TCP collectives.

The group's store is torch's (a ``PrefixStore`` over the job's TCPStore; on a world shared from
``pt_dist.init_process_group``, pt-dist's own store seen as a ``torch.distributed.Store``). The socket mesh
the native groups open for point-to-point transfers authenticates peers with a secret: ``$PT_DIST_SECRET``
where set, otherwise 16 random bytes rank 0 draws and leaves in that store (as secret as torch's own store,
which gloo trusts too).
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.torch_store import TorchStore
from pt_dist.backends.registry import Backend
from pt_dist.process_group import ReduceOp

NAMES = {"pt_tcp": "tcp", "pt_shm": "shm"}


def _work(work) -> dist.Work:
    return _create_work_from_future(work.get_future())


def _op(opts) -> ReduceOp:
    return ReduceOp.of(opts.reduceOp)


def _one(tensors, what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"{what}: pt-dist's backends take one tensor per rank (CPU), got {len(tensors)}")
    return tensors[0]


class TorchBackend(dist.ProcessGroup):
    """A pt-dist ``ProcessGroupSHM`` / ``ProcessGroupTCP`` behind torch's ``ProcessGroup`` interface."""

    def __init__(self, inner, backend_name: str):
        super().__init__(inner.rank(), inner.size())
        self.inner, self._name = inner, backend_name

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self._name

    @property
    def supports_splitting(self) -> bool:
        return False

    # collectives, in torch's calling convention ------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        t = _one(tensors, "allreduce")
        return _work(self.inner.all_reduce(t, _op(opts), async_op=True))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)
        work = self.inner.all_reduce(flat, _op(opts), async_op=True)

        def unpack(fut):
            at = 0
            for t in tensors:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()
            return tensors
        return _create_work_from_future(work.get_future().then(unpack))

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        return _work(self.inner.broadcast(_one(tensors, "broadcast"), opts.rootRank, async_op=True))

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        return _work(self.inner.reduce(_one(tensors, "reduce"), opts.rootRank, _op(opts), async_op=True))

    def allgather(self, output_tensors, input_tensors, opts=None):
        outs = _one(output_tensors, "allgather")
        return _work(self.inner.all_gather(outs, _one(input_tensors, "allgather"), async_op=True))

    def _allgather_base(self, output, input, opts=None):
        return _work(self.inner.all_gather_into_tensor(output, input, async_op=True))

    allgather_into_tensor = all_gather_single = _allgather_base  # (torch 2.15 calls the last)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.inner.all_gather_into_tensor(o, i, async_op=True) for o, i in zip(outputs, inputs)]
        return _collected(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        works = [self.inner.all_gather(outs, i, async_op=True) for outs, i in zip(output_lists, inputs)]
        return _collected(works, output_lists)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        out, ins = _one(output_tensors, "reduce_scatter"), _one(input_tensors, "reduce_scatter")
        return _work(self.inner.reduce_scatter_tensor(out, torch.cat([t.reshape(-1) for t in ins]).view(
            len(ins) * out.shape[0] if out.dim() else len(ins), *out.shape[1:]), _op(opts), async_op=True))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return _work(self.inner.reduce_scatter_tensor(output, input, _op(opts), async_op=True))

    reduce_scatter_tensor = reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        works = [self.inner.reduce_scatter_tensor(o, i, _op(opts), async_op=True) for o, i in zip(outputs, inputs)]
        return _collected(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return _work(self.inner.all_to_all_single(output, input, output_split_sizes or None,
                                                  input_split_sizes or None, async_op=True))

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        inp = torch.cat([t.reshape(-1) for t in input_tensors])
        out = torch.empty(sum(t.numel() for t in output_tensors), dtype=inp.dtype)
        work = self.inner.all_to_all_single(out, inp, [t.numel() for t in output_tensors],
                                            [t.numel() for t in input_tensors], async_op=True)

        def unpack(fut):
            at = 0
            for t in output_tensors:
                t.copy_(out[at:at + t.numel()].view_as(t))
                at += t.numel()
            return output_tensors
        return _create_work_from_future(work.get_future().then(unpack))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        root = opts.rootRank
        outs = _one(output_tensors, "gather") if self.rank() == root else None
        return _work(self.inner.gather(_one(input_tensors, "gather"), outs, root, async_op=True))

    def gather_single(self, output, input, opts=None):
        """torch 2.15's ``gather_single``: the root's output holds the N inputs end to end."""
        opts = opts or dist.GatherOptions()
        root = opts.rootRank
        outs = list(output.chunk(self.size())) if self.rank() == root else None
        return _work(self.inner.gather(input, outs, root, async_op=True))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        root = opts.rootRank
        ins = _one(input_tensors, "scatter") if self.rank() == root else None
        return _work(self.inner.scatter(_one(output_tensors, "scatter"), ins, root, async_op=True))

    def barrier(self, opts=None):
        return _work(self.inner.barrier(async_op=True))

    def send(self, tensors, dst, tag=0):
        return _work(self.inner.send(_one(tensors, "send"), dst, tag))

    def recv(self, tensors, src, tag=0):
        return _work(self.inner.recv(_one(tensors, "recv"), src, tag))

    def recv_anysource(self, tensors, tag=0):
        return _work(self.inner.recv(_one(tensors, "recv"), None, tag))

    def shutdown(self) -> None:
        """torch's destroy_process_group calls this; the group then lets go of the pt-dist group (and so of torch's
        store under it: torch keeps this object alive from C++, where no garbage collection sees the cycle)."""
        if self.inner is not None and not _owned_elsewhere(self.inner):
            self.inner.shutdown()
        self.inner = None

    def abort(self) -> None:
        if self.inner is not None:
            self.inner.abort()


def _owned_elsewhere(inner) -> bool:
    """A pt-dist world group shared with torch (``share_world``) is pt-dist's to shut down."""
    return inner is c10d.GroupMember.WORLD


def _collected(works, outputs) -> dist.Work:
    """One torch Work for several of ours (the coalesced forms): done when the last is."""
    fut = torch.futures.collect_all([w.get_future() for w in works]).then(lambda _: outputs)
    return _create_work_from_future(fut)


def _secret(store, rank: int) -> bytes:
    given = os.environ.get("PT_DIST_SECRET")
    if given:
        return given.encode()
    if rank == 0:
        store.set("pt_dist/secret", secrets.token_hex(16))
    return bytes(store.get("pt_dist/secret"))


_adopted: list = []  # a pt-dist world group torch's default group is to wrap instead of building its own
_kept_stores: list = []


def share_world(pg, backend: str, store=None) -> bool:
    """After ``pt_dist.init_process_group("tcp" | "shm")``: make torch's default group this very group, so torch
    utilities that ask ``torch.distributed`` for the world (``DistributedSampler()``, ``get_rank()``) see it.
    Nothing is opened: no second rendezvous, no second segment. False where torch already has a default group."""
    if dist.is_initialized():
        return False
    _adopted.append(pg)
    try:
        shared = dist.HashStore() if store is None else TorchStore(store)
        _kept_stores[:] = [shared]  # torch holds the C++ side only: the Python object must outlive the group
        dist.init_process_group(f"pt_{backend}", store=shared, rank=pg.rank(), world_size=pg.size())
    finally:
        _adopted.clear()
    return True


def unshare_world(pg) -> None:
    """Before the pt-dist world group shuts down: forget torch's default group where it wraps it."""
    if dist.is_initialized():
        inner = getattr(dist.distributed_c10d._get_default_group(), "inner", None)
        if inner is None:
            backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            inner = getattr(backend, "inner", None)
        if inner is pg:
            dist.destroy_process_group()
            _kept_stores.clear()


def _creator(name: str):
    def create(store, rank: int, size: int, timeout: timedelta):
        if _adopted:
            return TorchBackend(_adopted[0], name)
        native = NAMES[name]
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        inner = Backend.creator(native)(store, rank, size, seconds, name, _secret(store, rank), list(range(size)))
        return TorchBackend(inner, name)
    return create


def register() -> None:
    """Make ``pt_tcp`` and ``pt_shm`` names torch's ``init_process_group`` / ``new_group`` take (idempotent)."""
    for name in NAMES:
        if not hasattr(dist.Backend, name.upper()):
            dist.Backend.register_backend(name, _creator(name), devices=["cpu"])


def _on_init(pg, backend: str, store) -> None:
    if backend in ("tcp", "shm"):
        share_world(pg, backend, store)  # torch.distributed.get_rank(), DistributedSampler() see the world too


register()  # torch.distributed.init_process_group("pt_shm" | "pt_tcp") from here on
c10d.world_hooks.append((_on_init, unshare_world))
