"""``"gloo"``, ``"nccl"``, ``"mpi"``: thin adapters onto torch.distributed's real process groups.

The production path: our rendezvous (store, rank, size) bootstraps ``torch.distributed``'s own default
group, through our authenticated store (``torch_store.py``), so torch's DDP/FSDP and the real libraries run on
the very same group; their own data connections are torch's, unauthenticated as in torch. The adapter only
translates group-local ranks to global ones, emulates ``ReduceOp.AVG`` where the library lacks it
(gloo), stages non-contiguous tensors, and turns library failures into ``DistError``.
"""

from __future__ import annotations

import datetime
import os
import threading

import torch
import torch.distributed as dist

from pt_dist.backends.arguments import check_contiguous, check_tensor, contig
from pt_dist.backends.sparse import check_sparse_all_reduce
from pt_dist.backends.torch_store import TorchStore
from pt_dist.errors import DistBackendError, DistError
from pt_dist.process_group import ProcessGroup, ReduceOp, check_reduce_dtype
from pt_dist.work import Work

_TORCH_OPS = {op: op.name for op in ReduceOp}
_views: list[TorchStore] = []  # the store torch's default group and its sub-groups rendezvous on


def check_available(name: str) -> None:
    """Fail before any communication when this torch build cannot run the backend."""
    if name == "mpi" and not dist.is_mpi_available():
        raise DistError("backend 'mpi' needs a torch build with MPI support, and this one has none "
                        "(torch.distributed.is_mpi_available() is False); use 'gloo', 'tcp' or 'shm', or build "
                        "torch from source against an MPI library")
    if name == "nccl" and not (dist.is_nccl_available() and torch.cuda.is_available()):
        raise DistError("backend 'nccl' needs CUDA devices and a torch build with NCCL; use 'gloo', 'tcp' or 'shm'")
    if name == "gloo" and not dist.is_gloo_available():
        raise DistError("backend 'gloo' is not available in this torch build")


class _TorchWork(Work):
    """Wraps a torch Work; ``post`` (copy-back, AVG division) runs exactly once after completion.

    On GPUs torch's Work orders streams rather than blocking: NCCL marks its future complete at launch, and each
    ``wait()`` makes the caller's current stream wait for the kernel. So every ``wait()`` here calls torch's,
    and, where ``get_future()`` ran the post step in a callback (on a stream from torch's pool), also waits on
    that CUDA-aware future, which orders the current stream after the post's copies. Only with ``streams``
    (NCCL's groups): gloo's point-to-point Work waits for another transfer when waited on twice.
    """

    def __init__(self, op_name: str, group_name: str, twork, result, post=None, streams: bool = False):
        super().__init__(op_name)
        self._streams = streams
        self._twork, self._result, self._post, self._group = twork, result, post, group_name
        self._post_lock = threading.RLock()  # (get_future chains under it; a done future runs the post at once)
        self._claimed = False  # by the one waiter that finishes the Work
        self._chained: torch.futures.Future | None = None  # torch's future with the post step, once asked for

    def _run_post(self):
        with self._post_lock:
            if self._post is not None:
                post, self._post = self._post, None
                with torch.inference_mode():  # copy-backs and AVG on inference tensors, as c10d's own writes
                    post()
        return self._result

    def wait(self, timeout=None):
        """Several threads may wait at once (a watchdog polling ``is_completed`` while the caller waits): one of
        them finishes the Work. A ``timeout`` that runs out leaves it pending, as torch's (a later wait succeeds)."""
        if self._done.is_set():
            super().wait()
            return self._order_streams(again=True)
        result, exc = None, None
        try:
            if self._twork is not None:
                self._twork.wait() if timeout is None else self._twork.wait(
                    timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=timeout))
            result = self._run_post()
        except DistError as e:
            exc = e
        except RuntimeError as e:
            exc = DistBackendError(f"{self.op_name} on group {self._group!r} failed in torch.distributed: {e}")
            ran_out = timeout is not None and self._twork is not None and not self._twork.is_completed()
            if ran_out:  # only this wait ran out
                raise DistBackendError(f"{self.op_name} on group {self._group!r}: Work.wait timed out after "
                                       f"{timeout}") from e
        with self._post_lock:
            claimed, self._claimed = not self._claimed, True
        if claimed:
            self._finish(result, exc)
        super().wait(timeout)
        return self._order_streams(again=not claimed)

    def _order_streams(self, again: bool) -> bool:
        if self._streams and self._twork is not None:
            if again:  # (the waiter that finished the Work has just waited on torch's)
                self._twork.wait()
            if self._chained is not None:
                self._chained.wait()
        return True

    def is_completed(self):  # done only once the post step (AVG's division, a copy-back) is, as torch's own work
        if self._done.is_set() or self._twork is None:
            return True
        if not self._twork.is_completed():
            return False
        try:  # torch's part is over: run the post step now, without blocking (a failure waits for wait())
            self.wait()
        except Exception:  # noqa: BLE001
            pass
        return True

    def _source_rank(self) -> int:
        self.wait()
        return self._source if self._source is not None else self._twork._source_rank()  # any source: torch's

    def get_future(self):
        """torch's own future (CUDA-aware on GPUs) chained with the post step; the same one on every call."""
        if self._twork is None:
            return super().get_future()
        with self._post_lock:
            if self._chained is None:
                try:
                    future = self._twork.get_future()
                except RuntimeError:  # some of torch's Works have none (gloo's reduce_scatter_tensor): ours, which
                    self._blocker = lambda work, timeout=None: self.wait(timeout)  # the first wait finishes
                    return super().get_future()
                self._chained = future.then(lambda fut: (fut.wait(), self._run_post())[1])
            return self._chained


class TorchProcessGroup(ProcessGroup):
    def __init__(self, backend: str, pg, rank: int, size: int, group_name: str):
        super().__init__(rank, size, group_name)
        self.backend, self.pg = backend, pg

    @classmethod
    def create(cls, name, store, rank, size, timeout, group_name, global_ranks, device_id=None, pg_options=None):
        check_available(name)
        td = datetime.timedelta(seconds=timeout)
        if dist.is_initialized():
            raise DistError(f"backend {name!r}: torch.distributed already has a default group; call "
                            f"destroy_process_group first")
        if name != "nccl":  # where it picks the GPU; bound to a gloo group, torch's new_group then calls a
            device_id = None  # split gloo lacks (AttributeError: perform_nocolor_split, torch 2.15)
        if name == "mpi":
            dist.init_process_group("mpi", timeout=td, pg_options=pg_options)
        else:
            if name == "nccl":
                if device_id is None:
                    local = int(os.environ.get("LOCAL_RANK", rank))  # torchrun's; else ranks fill hosts in order
                    torch.cuda.set_device(local % torch.cuda.device_count())
                else:
                    torch.cuda.set_device(device_id)
            view = TorchStore(store)  # torch rendezvous through our authenticated store, not an open c10d one
            dist.init_process_group(name, store=view, rank=rank, world_size=size, timeout=td, pg_options=pg_options,
                                    device_id=device_id)
            _views.append(view)  # alive as long as torch's groups call it (they hold only its C++ half)
        return cls(name, dist.group.WORLD, dist.get_rank(), dist.get_world_size(), group_name)

    @classmethod
    def new_subgroup(cls, name, global_ranks, timeout, group_name, **options):
        """Collective over the whole default group (or its members, with ``use_local_synchronization``)."""
        if name != "nccl":
            options.pop("device_id", None)  # as in create: torch's new_group then splits, which gloo cannot
        pg = dist.new_group(ranks=global_ranks, timeout=datetime.timedelta(seconds=timeout), backend=name, **options)
        if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
            return None
        return cls(name, pg, dist.get_rank(pg), dist.get_world_size(pg), group_name)

    def split(self, split_ranks, timeout, group_name, group_desc=None, pg_options=None):
        """torch's ``split_group`` of this group (collective over it); ``None`` where this rank is in no split."""
        pg = dist.split_group(self.pg, [list(r) for r in split_ranks], timeout=datetime.timedelta(seconds=timeout),
                              pg_options=pg_options, group_desc=group_desc)
        if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
            return None
        return type(self)(self.backend, pg, dist.get_rank(pg), dist.get_world_size(pg), group_name)

    def name(self):
        return self.backend

    def abort(self):
        self.pg.abort()  # torch's own: gloo's leaves an operation in flight waiting for its peers (torch 2.15)

    def set_timeout(self, seconds):
        self.pg.set_timeout(datetime.timedelta(seconds=seconds))

    def backend_config(self) -> str:
        return dist.get_backend_config(self.pg)

    def shutdown(self):
        if self.pg is dist.group.WORLD:
            if dist.is_initialized():
                dist.destroy_process_group()
            _views.clear()
        elif dist.is_initialized():
            dist.destroy_process_group(self.pg)

    def _g(self, r: int) -> int:
        return dist.get_global_rank(self.pg, r) if self.pg is not dist.group.WORLD else r

    def _run(self, op_name, launch, result, async_op, post=None) -> Work:
        try:
            twork = launch()
        except RuntimeError as e:
            raise DistBackendError(f"{op_name} on group {self.group_name!r} ({self.backend}) failed: {e}") from e
        work = _TorchWork(op_name, self.group_name, twork, result, post, streams=self.backend == "nccl")
        if not async_op:
            work.wait()
        return work

    def _op(self, op, dtype, op_name):
        op = ReduceOp.of(op)
        check_reduce_dtype(op, dtype, op_name, cpu_fold=False)  # the library reduces (NCCL has fp8 sums)
        native_avg = self.backend == "nccl"
        top = getattr(dist.ReduceOp, _TORCH_OPS[op if op is not ReduceOp.AVG or native_avg else ReduceOp.SUM])
        return op, top, (op is ReduceOp.AVG and not native_avg)

    @staticmethod
    def _stage(t):
        """What the library gets: a dense, plain copy where ``t`` is strided or a lazy ``.conj()`` / negative view
        (torch's own collectives refuse those), or an inference tensor outside inference mode (the library's
        in-place writes would be refused); sparse tensors as they are (gloo all-reduces them)."""
        if t.is_sparse:
            return t
        if t.is_inference() and not torch.is_inference_mode_enabled():
            return t.clone(memory_format=torch.contiguous_format)
        return contig(t)

    @staticmethod
    def _args(op_name: str, written=(), read=()) -> None:
        """Up front, on the rank that got them, as the native backends check (``*_list`` arguments are lists)."""
        for is_written, (what, t) in [(True, w) for w in written] + [(False, r) for r in read]:
            listed = what.endswith("_list") and isinstance(t, (list, tuple))
            for i, x in enumerate(t) if listed else [(None, t)]:
                check_tensor(x, what if i is None else f"{what}[{i}]", op_name, written=is_written, native=False)

    def _posts(self, *steps):
        steps = [s for s in steps if s is not None]
        return (lambda: [s() for s in steps]) if steps else None

    # c10d works below autograd: every method first takes .detach() views (same storage), so tensors that
    # require grad (parameters) are written in place as torch.distributed itself does.
    def broadcast(self, tensor, src=0, async_op=False):
        self._args("broadcast", [("tensor", tensor)])
        tensor = tensor.detach()
        buf = self._stage(tensor)
        back = (lambda: tensor.copy_(buf)) if buf is not tensor else None
        return self._run("broadcast", lambda: dist.broadcast(buf, self._g(src), group=self.pg, async_op=True),
                         [tensor], async_op, back)

    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        self._args("all_reduce", [("tensor", tensor)])
        if tensor.layout != torch.strided:  # the library replaces a COO tensor's indices and values: no alias
            check_sparse_all_reduce(tensor, ReduceOp.of(op))
            return self._run("all_reduce", lambda: dist.all_reduce(tensor, group=self.pg, async_op=True), [tensor],
                             async_op)
        op, top, emulate_avg = self._op(op, tensor.dtype, "all_reduce")
        tensor = tensor.detach()
        buf = self._stage(tensor)
        avg = (lambda: buf.div_(self._size)) if emulate_avg else None
        back = (lambda: tensor.copy_(buf)) if buf is not tensor else None
        return self._run("all_reduce", lambda: dist.all_reduce(buf, top, group=self.pg, async_op=True),
                         [tensor], async_op, self._posts(avg, back))

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        self._args("reduce", [("tensor", tensor)])
        op, top, emulate_avg = self._op(op, tensor.dtype, "reduce")
        mine, tensor = self._rank == dst, tensor.detach()
        # gloo scribbles partial sums on non-root inputs; keep the caller's tensor intact as the native backends do
        buf = self._stage(tensor) if mine else tensor.clone(memory_format=torch.contiguous_format)
        avg = (lambda: buf.div_(self._size)) if emulate_avg and mine else None
        back = (lambda: tensor.copy_(buf)) if buf is not tensor and mine else None
        return self._run("reduce", lambda: dist.reduce(buf, self._g(dst), top, group=self.pg, async_op=True),
                         [tensor], async_op, self._posts(avg, back))

    def all_gather_into_tensor(self, output_tensor, input_tensor, async_op=False):
        self._args("all_gather_into_tensor", [("output_tensor", output_tensor)], [("input_tensor", input_tensor)])
        output_tensor, input_tensor = output_tensor.detach(), input_tensor.detach()
        out = self._stage(output_tensor)
        back = (lambda: output_tensor.copy_(out)) if out is not output_tensor else None
        return self._run("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
            out.view(-1), self._stage(input_tensor).view(-1), group=self.pg, async_op=True), [output_tensor], async_op,
            back)

    def all_gather(self, tensor_list, tensor, async_op=False):
        self._args("all_gather", [("tensor_list", tensor_list)], [("tensor", tensor)])
        tensor, tensor_list = tensor.detach(), [t.detach() for t in tensor_list]
        bufs = [self._stage(t) for t in tensor_list]
        backs = [(lambda t=t, b=b: t.copy_(b)) for t, b in zip(tensor_list, bufs) if b is not t]
        return self._run("all_gather", lambda: dist.all_gather(bufs, self._stage(tensor), group=self.pg,
                                                               async_op=True), tensor_list, async_op,
                         self._posts(*backs))

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, async_op=False):
        self._args("reduce_scatter_tensor", [("output", output)], [("input", input)])
        op, top, emulate_avg = self._op(op, input.dtype, "reduce_scatter_tensor")
        output, input = output.detach(), input.detach()
        out = self._stage(output)
        avg = (lambda: out.div_(self._size)) if emulate_avg else None
        back = (lambda: output.copy_(out)) if out is not output else None
        return self._run("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(
            out.view(-1), self._stage(input).view(-1), top, group=self.pg, async_op=True), [output], async_op,
            self._posts(avg, back))

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False):
        self._args("all_to_all_single", [("output", output)], [("input", input)])
        check_contiguous(input, "input", "all_to_all_single")  # (torch's own check; staging would hide it)
        output, input = output.detach(), input.detach()
        out = self._stage(output)
        back = (lambda: output.copy_(out)) if out is not output else None
        return self._run("all_to_all_single", lambda: dist.all_to_all_single(
            out, self._stage(input), output_split_sizes, input_split_sizes, group=self.pg, async_op=True),
            [output], async_op, back)

    def gather(self, tensor, gather_list=None, dst=0, async_op=False):
        self._args("gather", [("gather_list", gather_list or [])], [("tensor", tensor)])
        tensor = tensor.detach()
        outs = [t.detach() for t in gather_list or []]
        bufs = [self._stage(t) for t in outs]
        backs = [(lambda t=t, b=b: t.copy_(b)) for t, b in zip(outs, bufs) if b is not t]
        return self._run("gather", lambda: dist.gather(self._stage(tensor), bufs or None, self._g(dst),
                                                       group=self.pg, async_op=True),
                         outs if self._rank == dst else [], async_op, self._posts(*backs))

    def scatter(self, tensor, scatter_list=None, src=0, async_op=False):
        self._args("scatter", [("tensor", tensor)], [("scatter_list", scatter_list or [])])
        tensor = tensor.detach()
        buf = self._stage(tensor)
        back = (lambda: tensor.copy_(buf)) if buf is not tensor else None
        ins = [self._stage(t.detach()) for t in scatter_list or []] or None
        return self._run("scatter", lambda: dist.scatter(buf, ins, self._g(src), group=self.pg, async_op=True),
                         [tensor], async_op, back)

    def send(self, tensor, dst, tag=0):
        self._args("send", (), [("tensor", tensor)])
        if dst == self._rank:
            raise ValueError(f"send: dst={dst} is this rank")
        tensor = tensor.detach()
        return self._run("send", lambda: dist.isend(self._stage(tensor), self._g(dst), group=self.pg, tag=tag),
                         [tensor], True)

    def recv(self, tensor, src, tag=0):
        self._args("recv", [("tensor", tensor)])
        if src == self._rank:
            raise ValueError(f"recv: src={src} is this rank")
        tensor = tensor.detach()
        buf = self._stage(tensor)
        back = (lambda: tensor.copy_(buf)) if buf is not tensor else None
        work = self._run("recv", lambda: dist.irecv(buf, None if src is None else self._g(src), group=self.pg,
                                                    tag=tag), [tensor], True, back)
        work._source = src
        return work

    def barrier(self, async_op=False, device_ids=None, timeout=None):
        td = None if timeout is None else datetime.timedelta(seconds=timeout)
        return self._run("barrier", lambda: dist.barrier(group=self.pg, async_op=True, device_ids=device_ids,
                                                         timeout=td), [], async_op)
