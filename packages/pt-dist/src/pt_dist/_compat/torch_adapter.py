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

import torch
import torch.distributed as dist

from pt_dist._compat.torch_store import TorchStore
from pt_dist._compat.torch_work import TorchWork
from pt_dist._infra.errors import DistBackendError, DistError
from pt_dist.backends.arguments import check_contiguous, check_tensor, contig
from pt_dist.backends.registry import Backend
from pt_dist.backends.sparse import check_sparse_all_reduce
from pt_dist.process_group import ProcessGroup, ReduceOp, check_reduce_dtype

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

    def _op(self, op, dtype, op_name):
        """(our op, torch's, whether AVG is emulated: gloo has no AVG, so it sums and the post step divides)."""
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

    def _staged(self, op_name: str, launch, written=(), read=(), result=None, async_op=False, average=False):
        """The one shape of every adapter call: check the tensors up front (as the native backends do), stage
        them (``_stage``), ``launch(*written_bufs, *read_bufs)`` torch's call (async), and run the post step once
        it is done: the emulated AVG's division of the outputs, then the copy back into staged ones. ``written`` /
        ``read``: the output and input tensors (c10d works below autograd: each is used through ``.detach()``)."""
        for is_written, tensors in ((True, written), (False, read)):
            for what, t in tensors:
                check_tensor(t, what, op_name, written=is_written, native=False)
        outs = [t.detach() for _, t in written]
        out_bufs, in_bufs = [self._stage(t) for t in outs], [self._stage(t.detach()) for _, t in read]
        steps = [(lambda b=b: b.div_(self._size)) for b in out_bufs] if average else []
        steps += [(lambda t=t, b=b: t.copy_(b)) for t, b in zip(outs, out_bufs) if b is not t]
        post = (lambda: [step() for step in steps]) if steps else None
        try:
            twork = launch(*out_bufs, *in_bufs)
        except RuntimeError as e:
            raise DistBackendError(f"{op_name} on group {self.group_name!r} ({self.backend}) failed: {e}") from e
        work = TorchWork(op_name, self.group_name, twork, outs if result is None else result, post,
                         streams=self.backend == "nccl")
        if not async_op:
            work.wait()
        return work

    @staticmethod
    def _listed(what: str, tensors) -> list:
        if not isinstance(tensors, (list, tuple)):
            raise TypeError(f"{what} must be a list of tensors, got {type(tensors).__name__}")
        return [(f"{what}[{i}]", t) for i, t in enumerate(tensors)]

    # the collectives: torch's calls, through _staged -------------------------------------------------
    def broadcast(self, tensor, src=0, async_op=False):
        return self._staged("broadcast", lambda b: dist.broadcast(b, self._g(src), group=self.pg, async_op=True),
                            [("tensor", tensor)], async_op=async_op)

    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        if isinstance(tensor, torch.Tensor) and tensor.layout != torch.strided:  # the library replaces a COO
            check_sparse_all_reduce(tensor, ReduceOp.of(op))  # tensor's indices and values: no alias, no staging
            return self._staged("all_reduce", lambda: dist.all_reduce(tensor, group=self.pg, async_op=True),
                                result=[tensor], async_op=async_op)
        check_tensor(tensor, "tensor", "all_reduce", written=True, native=False)
        op, top, emulate = self._op(op, tensor.dtype, "all_reduce")
        return self._staged("all_reduce", lambda b: dist.all_reduce(b, top, group=self.pg, async_op=True),
                            [("tensor", tensor)], async_op=async_op, average=emulate)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        check_tensor(tensor, "tensor", "reduce", written=True, native=False)
        op, top, emulate = self._op(op, tensor.dtype, "reduce")
        launch = lambda b: dist.reduce(b, self._g(dst), top, group=self.pg, async_op=True)  # noqa: E731
        if self._rank == dst:
            return self._staged("reduce", launch, [("tensor", tensor)], async_op=async_op, average=emulate)
        # gloo scribbles partial sums on non-root inputs: keep the caller's intact, as the native backends do
        copy = tensor.detach().clone(memory_format=torch.contiguous_format)
        return self._staged("reduce", launch, read=[("tensor", copy)], result=[tensor.detach()], async_op=async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, async_op=False):
        return self._staged("all_gather_into_tensor", lambda o, i: dist.all_gather_into_tensor(
            o.view(-1), i.view(-1), group=self.pg, async_op=True), [("output_tensor", output_tensor)],
            [("input_tensor", input_tensor)], async_op=async_op)

    def all_gather(self, tensor_list, tensor, async_op=False):
        return self._staged("all_gather", lambda *b: dist.all_gather(list(b[:-1]), b[-1], group=self.pg,
                                                                     async_op=True),
                            self._listed("tensor_list", tensor_list), [("tensor", tensor)], async_op=async_op)

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, async_op=False):
        check_tensor(output, "output", "reduce_scatter_tensor", written=True, native=False)
        check_tensor(input, "input", "reduce_scatter_tensor", native=False)
        op, top, emulate = self._op(op, input.dtype, "reduce_scatter_tensor")
        return self._staged("reduce_scatter_tensor", lambda o, i: dist.reduce_scatter_tensor(
            o.view(-1), i.view(-1), top, group=self.pg, async_op=True), [("output", output)], [("input", input)],
            async_op=async_op, average=emulate)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False):
        check_tensor(input, "input", "all_to_all_single", native=False)
        check_contiguous(input, "input", "all_to_all_single")  # (torch's own check; staging would hide it)
        return self._staged("all_to_all_single", lambda o, i: dist.all_to_all_single(
            o, i, output_split_sizes, input_split_sizes, group=self.pg, async_op=True), [("output", output)],
            [("input", input)], async_op=async_op)

    def gather(self, tensor, gather_list=None, dst=0, async_op=False):
        outs = gather_list or []
        return self._staged("gather", lambda *b: dist.gather(b[-1], list(b[:-1]) or None, self._g(dst),
                                                             group=self.pg, async_op=True),
                            self._listed("gather_list", outs), [("tensor", tensor)],
                            result=[t.detach() for t in outs] if self._rank == dst else [], async_op=async_op)

    def scatter(self, tensor, scatter_list=None, src=0, async_op=False):
        ins = scatter_list or []
        return self._staged("scatter", lambda *b: dist.scatter(b[0], list(b[1:]) or None, self._g(src),
                                                               group=self.pg, async_op=True),
                            [("tensor", tensor)], self._listed("scatter_list", ins), async_op=async_op)

    def send(self, tensor, dst, tag=0):
        check_tensor(tensor, "tensor", "send", native=False)
        if dst == self._rank:
            raise ValueError(f"send: dst={dst} is this rank")
        return self._staged("send", lambda b: dist.isend(b, self._g(dst), group=self.pg, tag=tag),
                            read=[("tensor", tensor)], result=[tensor.detach()], async_op=True)

    def recv(self, tensor, src, tag=0):
        check_tensor(tensor, "tensor", "recv", written=True, native=False)
        if src == self._rank:
            raise ValueError(f"recv: src={src} is this rank")
        work = self._staged("recv", lambda b: dist.irecv(b, None if src is None else self._g(src), group=self.pg,
                                                         tag=tag), [("tensor", tensor)], async_op=True)
        work._source = src
        return work

    def barrier(self, async_op=False, device_ids=None, timeout=None):
        td = None if timeout is None else datetime.timedelta(seconds=timeout)
        return self._staged("barrier", lambda: dist.barrier(group=self.pg, async_op=True, device_ids=device_ids,
                                                            timeout=td), result=[], async_op=async_op)


class TorchBackedCreator:
    """Backend ``name``'s entry in the registry (``backends/registry.py``): builds torch's own group, and says
    before any communication whether this build and machine can run it."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, store, rank, size, timeout, group_name, secret, global_ranks, **library_options):
        """``library_options``: init_process_group's ``device_id`` and ``pg_options``, for torch's own group."""
        return TorchProcessGroup.create(self.name, store, rank, size, timeout, group_name, global_ranks,
                                        **library_options)

    def check_available(self) -> None:
        check_available(self.name)

    def new_subgroup(self, global_ranks, timeout, group_name, **options):
        return TorchProcessGroup.new_subgroup(self.name, global_ranks, timeout, group_name, **options)


for _name in ("gloo", "nccl", "mpi"):
    Backend.register_backend(_name, TorchBackedCreator(_name), torch_backed=True)
