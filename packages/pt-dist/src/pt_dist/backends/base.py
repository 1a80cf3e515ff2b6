"""What the native backends share: every collective's front end, in one pattern (torch's ``ProcessGroupGloo``).

Each collective method reads the same way: **check** its arguments on this rank (``arguments.py``: a bad call
never reaches the wire), build the **header** every rank must agree on (op, dtype, shape, root), give the
**body** (the algorithm on flat contiguous views, the subclass's ``_all_reduce`` etc.), and **launch**: on the
group's queue (``work.py``; inline when nothing is queued), the ranks first exchange headers, so ranks that call
different collectives or pass different shapes all raise the same error instead of exchanging garbage (c10d's
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` fingerprints, always on), then run the body under the failure policy
(``failure.py``).
"""

from __future__ import annotations

import abc
import math

import torch

from pt_dist._infra import failure
from pt_dist._infra.failure import HeaderMismatch
from pt_dist.backends import arguments as args
from pt_dist.backends.arguments import contig, desc, overlap, through
from pt_dist.backends.sparse import check_sparse_all_reduce, sparse_all_reduce, sparse_header
from pt_dist.process_group import ProcessGroup, ReduceOp
from pt_dist.work import OpQueue, Work

__all__ = ["HeaderMismatch", "NativeProcessGroup"]


class NativeProcessGroup(ProcessGroup):
    """Base of the from-scratch backends; subclasses supply the transport and the algorithms (the ``_`` hooks)."""

    def __init__(self, rank: int, size: int, timeout: float, group_name: str = ""):
        super().__init__(rank, size, group_name)
        self.timeout = float(timeout)
        self._seq = 0  # collectives so far: part of every header, so a rank that skipped one is caught
        self._broken: str | None = None  # why the group refuses work (failure.py)
        self._queue = OpQueue(f"{self.name()}-{group_name}")

    # the protocol ---------------------------------------------------------------------------------
    def _launch(self, op_name: str, body, async_op: bool, header: str = "", per_rank: str = "",
                agree: bool = True, timeout: float | None = None) -> Work:
        """Queue ``body``: headers agreed first (``per_rank`` rides along unchecked; the body gets every rank's)."""
        def run():
            with failure.own_timeout(self, timeout), failure.policy(self, op_name):
                self._seq += 1
                self._placed = self._agree(op_name, header, per_rank) if agree else None
                with torch.inference_mode():  # c10d writes below autograd: inference tensors too
                    return body(self._placed)
        return self._queue.submit(op_name, run, async_op)

    def _agree(self, op_name: str, header: str, per_rank: str) -> list[str]:
        mine = self._mine(op_name, header)
        return self._check_headers(op_name, mine, self._exchange_headers(f"{mine}#{per_rank}".encode(), op_name))

    def _mine(self, op_name: str, header: str) -> str:
        return f"{op_name}|seq={self._seq}|{header}"

    def _check_headers(self, op_name: str, mine: str, blobs: list[bytes]) -> list[str]:
        """Every rank runs this on the same headers, so a mismatch raises everywhere at once."""
        commons, infos = zip(*(b.decode(errors="replace").partition("#")[::2] for b in blobs))
        if any(c != mine for c in commons):
            lines = "; ".join(f"rank {r}: {c}" for r, c in enumerate(commons))
            raise HeaderMismatch(f"{op_name} on group {self.group_name!r}: ranks called mismatched collectives "
                                 f"(op/dtype/shape/root differ): {lines}")
        return list(infos)

    # collectives: check -> header -> body -> launch --------------------------------------------------
    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        if isinstance(tensor, torch.Tensor) and tensor.is_sparse and tensor.device.type == "cpu":
            check_sparse_all_reduce(tensor, ReduceOp.of(op))  # written in place: not through a detached alias
            return self._launch("all_reduce", lambda _: sparse_all_reduce(self, tensor), async_op,
                                sparse_header(tensor))
        tensor, op = args.reduced(tensor, op, "all_reduce")
        header = f"{desc(tensor)}|{op.name}"
        return self._launch("all_reduce", lambda _: through(tensor, lambda t: self._all_reduce(t, op)), async_op,
                            header)

    def broadcast(self, tensor, src=0, async_op=False):
        tensor = args.written(tensor, "tensor", "broadcast")
        args.check_root(src, "src", "broadcast", self._size, self.group_name)
        common, mine = self._placement(tensor)
        header = f"{desc(tensor)}|src={src}{common}"
        return self._launch("broadcast", lambda _: through(tensor, lambda t: self._broadcast(t, src)), async_op,
                            header, mine)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        tensor, op = args.reduced(tensor, op, "reduce")
        args.check_root(dst, "dst", "reduce", self._size, self.group_name)
        header = f"{desc(tensor)}|{op.name}|dst={dst}"
        return self._launch("reduce", lambda _: through(tensor, lambda t: self._reduce(t, dst, op),
                                                        write_back=self._rank == dst), async_op, header)

    def all_gather_into_tensor(self, output_tensor, input_tensor, async_op=False):
        out = args.written(output_tensor, "output_tensor", "all_gather_into_tensor")
        inp = args.read(input_tensor, "input_tensor", "all_gather_into_tensor")
        args.check_world_times(out, inp, self._size, "all_gather_into_tensor", ("output", "input"))
        inp = args.read_apart(out, inp, self._rank, inp)
        common, mine = self._placement(inp)
        return self._launch("all_gather_into_tensor", lambda _: through(
            out, lambda o: self._all_gather(o, contig(inp).view(-1))), async_op, desc(inp) + common, mine)

    def all_gather(self, tensor_list, tensor, async_op=False):
        tensor = args.read(tensor, "tensor", "all_gather")
        if len(tensor_list) != self._size:
            raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} entries, group size is {self._size}")
        outs = [args.written(t, f"tensor_list[{i}]", "all_gather") for i, t in enumerate(tensor_list)]
        for i, t in enumerate(outs):
            if t.dtype != tensor.dtype or t.numel() != tensor.numel():
                raise ValueError(f"all_gather: tensor_list[{i}] is {desc(t)}, input is {desc(tensor)}")
        common, mine = self._placement(tensor)

        def body(_):
            flat = torch.empty(self._size * tensor.numel(), dtype=tensor.dtype)
            self._all_gather(flat, contig(tensor).view(-1))
            for t, piece in zip(outs, flat.chunk(self._size) if tensor.numel() else [flat] * self._size):
                t.copy_(piece.view(t.shape))
            return outs
        return self._launch("all_gather", body, async_op, desc(tensor) + common, mine)

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, async_op=False):
        out, op = args.reduced(output, op, "reduce_scatter_tensor", "output")
        inp = args.read(input, "input", "reduce_scatter_tensor")
        args.check_world_times(inp, out, self._size, "reduce_scatter_tensor", ("input", "output"))
        inp = args.read_apart(inp, out, self._rank, inp)
        common, mine = self._placement(inp)
        header = f"{desc(out)}|{op.name}{common}"
        return self._launch("reduce_scatter_tensor", lambda _: through(
            out, lambda o: self._reduce_scatter(o, contig(inp).view(-1), op)), async_op, header, mine)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False):
        output = args.written(output, "output", "all_to_all_single")
        input = args.read(input, "input", "all_to_all_single")
        args.check_contiguous(input, "input", "all_to_all_single")
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output dtype {output.dtype} != input dtype {input.dtype}")
        if overlap(output, input):  # torch's backends do not support it either (gloo returns garbage)
            raise ValueError("all_to_all_single: output and input share memory; all-to-all cannot run in place")
        if input.dim() == 0 or output.dim() == 0:
            raise ValueError("all_to_all_single: input and output need at least one dimension to split")
        # agreed in elements, as torch counts them: rows may differ in shape as long as r sends j what j expects
        sends = [s * math.prod(input.shape[1:]) for s in args.splits(input, input_split_sizes, "input_split_sizes",
                                                                     self._size)]
        takes = [s * math.prod(output.shape[1:]) for s in args.splits(output, output_split_sizes,
                                                                      "output_split_sizes", self._size)]

        def body(infos):
            longest = self._agree_splits(infos)
            return through(output, lambda o: self._all_to_all(o, contig(input).view(-1), takes, sends, longest))
        return self._launch("all_to_all_single", body, async_op, str(input.dtype),
                            f"{','.join(map(str, sends))};{','.join(map(str, takes))}")

    def _agree_splits(self, infos: list[str]) -> int:
        """Every rank sees every rank's element counts, so a disagreement raises on all of them together; returns
        the longest block any rank sends."""
        ins, outs = zip(*([list(map(int, p.split(","))) for p in info.split(";")] for info in infos))
        bad = [(r, j) for r in range(self._size) for j in range(self._size) if ins[r][j] != outs[j][r]]
        if bad:
            r, j = bad[0]
            raise HeaderMismatch(f"all_to_all_single on group {self.group_name!r}: rank {r} sends {ins[r][j]} "
                                 f"elements to rank {j}, which expects {outs[j][r]} (split sizes count slices of "
                                 f"dim 0)")
        return max(max(row) for row in ins)

    def gather(self, tensor, gather_list=None, dst=0, async_op=False):
        args.check_tensor(tensor, "tensor", "gather")
        args.check_root(dst, "dst", "gather", self._size, self.group_name)
        outs, tensor = args.rooted_list(gather_list, tensor, dst, self._rank, self._size, "gather", "gather_list")

        def body(_):
            bufs = [contig(t) for t in outs]
            self._gather([b.view(-1) for b in bufs], contig(tensor).view(-1), dst)
            for t, b in zip(outs, bufs):
                if b is not t:
                    t.copy_(b)
            return outs if self._rank == dst else []  # torch gloo's future value off the root
        return self._launch("gather", body, async_op, f"{desc(tensor)}|dst={dst}")

    def scatter(self, tensor, scatter_list=None, src=0, async_op=False):
        args.check_tensor(tensor, "tensor", "scatter", written=True)
        args.check_root(src, "src", "scatter", self._size, self.group_name)
        ins, tensor = args.rooted_list(scatter_list, tensor, src, self._rank, self._size, "scatter", "scatter_list")
        return self._launch("scatter", lambda _: through(
            tensor, lambda t: self._scatter(t, [contig(i).view(-1) for i in ins], src)), async_op,
            f"{desc(tensor)}|src={src}")

    def barrier(self, async_op=False, device_ids=None, timeout=None):  # CPU only: no device to pick
        def body(_):
            self._barrier()
            return []  # what torch's barrier future holds
        return self._launch("barrier", body, async_op, timeout=timeout)

    # point to point: the transport's channels, no header round ---------------------------------------
    def send(self, tensor, dst, tag=0):
        tensor = args.read(tensor, "tensor", "send")
        args.check_root(dst, "dst", "send", self._size, self.group_name)
        tag = args.check_tag(tag, "send")
        if dst == self._rank:
            raise ValueError(f"send: dst={dst} is this rank")
        return self._p2p("send", contig(tensor), dst, tag)

    def recv(self, tensor, src, tag=0):
        """``src=None``: from whichever rank sends ``tag`` first."""
        tensor = args.written(tensor, "tensor", "recv")
        if src is not None:
            args.check_root(src, "src", "recv", self._size, self.group_name)
        tag = args.check_tag(tag, "recv")
        if src == self._rank or (src is None and self._size == 1):
            raise ValueError(f"recv: src={src} is this rank" if src is not None else "recv: no other rank to receive "
                             "from in a group of one")
        buf = contig(tensor)
        return self._p2p("recv", buf, src, tag, None if buf is tensor else tensor)

    # the transport's hooks --------------------------------------------------------------------------
    @abc.abstractmethod
    def _exchange_headers(self, header: bytes, op_name: str) -> list[bytes]:
        """Every rank's header, by rank."""

    @abc.abstractmethod
    def _all_reduce(self, t: torch.Tensor, op: ReduceOp) -> None: ...

    @abc.abstractmethod
    def _broadcast(self, t: torch.Tensor, src: int) -> None: ...

    @abc.abstractmethod
    def _reduce(self, t: torch.Tensor, dst: int, op: ReduceOp) -> None: ...

    @abc.abstractmethod
    def _all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: ReduceOp) -> None: ...

    @abc.abstractmethod
    def _all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                    longest: int) -> None:
        """Splits are element counts of the flat 1-D views; ``longest`` is the largest split on any rank."""

    @abc.abstractmethod
    def _gather(self, outs: list[torch.Tensor], inp: torch.Tensor, dst: int) -> None:
        """Fill ``outs`` (flat, one per rank, on ``dst``; an empty list elsewhere) with every rank's ``inp``."""

    @abc.abstractmethod
    def _scatter(self, out: torch.Tensor, ins: list[torch.Tensor], src: int) -> None:
        """Fill ``out`` from ``ins[rank]`` (flat, one per rank, on ``src``; an empty list elsewhere)."""

    @abc.abstractmethod
    def _barrier(self) -> None: ...

    def _fence(self) -> None:
        """A full barrier between two transport steps of one collective's body."""
        self._barrier()

    @abc.abstractmethod
    def _p2p(self, kind: str, t: torch.Tensor, peer: int, tag: int, copy_back=None) -> Work:
        """Queue a send/recv on the peer channel; ``copy_back`` is where a received non-contiguous tensor goes."""

    def _placement(self, t: torch.Tensor) -> tuple[str, str]:
        """Where ``t`` lives, when that picks the algorithm (shm's symmetric heap): (header text every rank must
        agree on, this rank's own part). While a collective runs, ``self._placed`` holds every rank's own part."""
        return "", ""

    def _abort(self) -> None:  # noqa: B027 - backends close their transport so peers fail fast
        """Tear down the transport after a failure so peers blocked on us fail fast."""

    # group management --------------------------------------------------------------------------------
    def abort(self) -> None:
        """torch's ``ProcessGroup.abort``, from any thread (a watchdog's): a collective hung in the group raises
        now, later ones refuse, peers blocked on this rank fail fast; ``shutdown`` still releases the rest."""
        self._broken = self._broken or "the group was aborted (ProcessGroup.abort)"
        self._abort()

    def set_timeout(self, seconds: float) -> None:
        """Now; or, with operations still queued, right behind them (from the next one on, not mid-way in one)."""
        self._queue.submit("set_timeout", lambda: self._set_timeout(seconds), async_op=self._queue.busy)

    def _set_timeout(self, seconds: float) -> None:
        self.timeout = seconds
        if hasattr(self, "mesh"):  # the socket mesh keeps its own copy for its waits, and so do its p2p channels
            self.mesh.set_timeout(seconds)

    def shutdown(self) -> None:
        self._queue.shutdown()
