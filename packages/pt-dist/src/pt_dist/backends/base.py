"""What the native backends share: the collectives' front ends, the per-collective header agreement, failure policy.

Before every collective each rank publishes a short header (op, sequence number, dtype, shape, reduce
op, root) and checks everyone else's, so ranks that call different collectives, or the same one with
different shapes or dtypes, all raise the same ``DistError`` instead of exchanging garbage (the idea
of c10d's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` collective fingerprints, always on). Any other failure
(peer died, timeout) leaves the transport out of step, so the group refuses further work, as NCCL's
communicator abort does.
"""

from __future__ import annotations

import abc
import math
import operator

import torch

from pt_dist.backends.arguments import check_contiguous, check_tag, check_tensor, contig, overlap, read_apart
from pt_dist.backends.sparse import check_sparse_all_reduce, sparse_all_reduce, sparse_header
from pt_dist.errors import DistBackendError, DistError
from pt_dist.process_group import ProcessGroup, ReduceOp, check_reduce_dtype
from pt_dist.work import OpQueue, Work


class HeaderMismatch(DistBackendError):
    """Ranks disagreed on a collective's arguments; the transport is still in step."""


class NativeProcessGroup(ProcessGroup):
    """Base of the from-scratch backends; subclasses supply the transport and the algorithms."""

    def __init__(self, rank: int, size: int, timeout: float, group_name: str = ""):
        super().__init__(rank, size, group_name)
        self.timeout = float(timeout)
        self._seq = 0
        self._broken: str | None = None
        self._queue = OpQueue(f"{self.name()}-{group_name}")

    # transport hooks ---------------------------------------------------------------------------
    @abc.abstractmethod
    def _exchange_headers(self, header: bytes, op_name: str) -> list[bytes]:
        """Every rank's header, by rank."""

    @abc.abstractmethod
    def _broadcast(self, t: torch.Tensor, src: int) -> None: ...

    @abc.abstractmethod
    def _all_reduce(self, t: torch.Tensor, op: ReduceOp) -> None: ...

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

    def set_timeout(self, seconds: float) -> None:
        """Now; or, with operations still queued, right behind them (from the next one on, not mid-way in one)."""
        self._queue.submit("set_timeout", lambda: self._set_timeout(seconds), async_op=self._queue.busy)

    def _set_timeout(self, seconds: float) -> None:
        self.timeout = seconds
        if hasattr(self, "mesh"):  # the socket mesh keeps its own copy for its waits, and so do its p2p channels
            self.mesh.set_timeout(seconds)

    def _fence(self) -> None:
        """A full barrier between two transport steps of one collective's body."""
        self._barrier()

    @abc.abstractmethod
    def _p2p(self, kind: str, t: torch.Tensor, peer: int, tag: int, copy_back=None) -> Work:
        """Queue a send/recv on the peer channel; ``copy_back`` is where a received non-contiguous tensor goes."""

    # the shared protocol --------------------------------------------------------------------------
    def _launch(self, op_name: str, body, async_op: bool, header: str = "", per_rank: str = "",
                agree: bool = True, timeout: float | None = None) -> Work:
        def run():
            if timeout is None:
                return checked()
            saved = self.timeout  # this call's own deadline (torch's barrier(timeout=)); ops run one at a time
            self._set_timeout(timeout)
            try:
                return checked()
            finally:
                self._set_timeout(saved)

        def checked():
            if self._broken:
                raise DistBackendError(f"{op_name} on group {self.group_name!r}: the group is unusable after an "
                                       f"earlier failure: {self._broken}")
            try:
                self._seq += 1
                self._placed = self._agree(op_name, header, per_rank) if agree else None
                with torch.inference_mode():  # c10d writes below autograd: inference tensors too
                    return body(self._placed)
            except HeaderMismatch:
                raise
            except DistError as e:
                self._broken = str(e)
                self._abort()
                raise
            except (OSError, ConnectionError) as e:
                self._broken = f"{op_name}: {e!r}"
                self._abort()
                raise DistBackendError(f"{op_name} on group {self.group_name!r} (rank {self._rank}): transport "
                                       f"failure {e!r}") from e
            except (Exception, KeyboardInterrupt) as e:  # torch failing, or Ctrl-C, mid-way: peers may be
                # mid-transfer, so stop here too (a notebook user who interrupts a hung collective must not
                # run the next one out of step)
                self._broken = f"{op_name}: {e!r}"
                self._abort()
                raise
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

    def _fused_all_reduce(self, tensor: torch.Tensor, op: ReduceOp, header: str):
        """A backend may return a body that exchanges the header together with the data (one sync point)."""
        return None

    def _placement(self, t: torch.Tensor) -> tuple[str, str]:
        """Where ``t`` lives, when that picks the algorithm: (header text every rank must agree on, this rank's
        own part). While a collective runs, ``self._placed`` holds every rank's own header part, by rank."""
        return "", ""

    def _abort(self) -> None:  # noqa: B027 - backends close their transport so peers fail fast
        """Tear down the transport after a failure so peers blocked on us fail fast."""

    def abort(self) -> None:
        """torch's ``ProcessGroup.abort``, from any thread (a watchdog's): a collective hung in the group raises
        now, later ones refuse, peers blocked on this rank fail fast; ``shutdown`` still releases the rest."""
        self._broken = self._broken or "the group was aborted (ProcessGroup.abort)"
        self._abort()

    def _check_root(self, root: int, what: str, op_name: str) -> None:
        if not isinstance(root, int) or not 0 <= root < self._size:
            raise ValueError(f"{op_name}: {what}={root!r} is not a rank of group {self.group_name!r} "
                             f"(size {self._size})")

    @staticmethod
    def _desc(t: torch.Tensor) -> str:
        return f"{t.dtype}{list(t.shape)}"

    # collectives -------------------------------------------------------------------------------
    def broadcast(self, tensor, src=0, async_op=False):
        check_tensor(tensor, "tensor", "broadcast", written=True)
        self._check_root(src, "src", "broadcast")
        tensor = tensor.detach()

        common, mine = self._placement(tensor)

        def body(_):
            buf = contig(tensor)
            self._broadcast(buf.view(-1), src)
            if buf is not tensor:
                tensor.copy_(buf)
            return [tensor]
        return self._launch("broadcast", body, async_op, f"{self._desc(tensor)}|src={src}{common}", mine)

    def all_reduce(self, tensor, op=ReduceOp.SUM, async_op=False):
        if isinstance(tensor, torch.Tensor) and tensor.is_sparse and tensor.device.type == "cpu":
            check_sparse_all_reduce(tensor, ReduceOp.of(op))  # written in place: not through a detached alias
            return self._launch("all_reduce", lambda _: sparse_all_reduce(self, tensor), async_op,
                                sparse_header(tensor))
        check_tensor(tensor, "tensor", "all_reduce", written=True)
        op, tensor = ReduceOp.of(op), tensor.detach()
        check_reduce_dtype(op, tensor.dtype, "all_reduce")
        header = f"{self._desc(tensor)}|{op.name}"
        fused = self._fused_all_reduce(tensor, op, header)
        if fused is not None:
            return self._launch("all_reduce", fused, async_op, agree=False)

        def body(_):
            buf = contig(tensor)
            self._all_reduce(buf.view(-1), op)
            if buf is not tensor:
                tensor.copy_(buf)
            return [tensor]
        return self._launch("all_reduce", body, async_op, header)

    def reduce(self, tensor, dst=0, op=ReduceOp.SUM, async_op=False):
        check_tensor(tensor, "tensor", "reduce", written=True)
        self._check_root(dst, "dst", "reduce")
        op, tensor = ReduceOp.of(op), tensor.detach()
        check_reduce_dtype(op, tensor.dtype, "reduce")

        def body(_):
            buf = contig(tensor)
            self._reduce(buf.view(-1), dst, op)
            if buf is not tensor and self._rank == dst:
                tensor.copy_(buf)
            return [tensor]
        return self._launch("reduce", body, async_op, f"{self._desc(tensor)}|{op.name}|dst={dst}")

    def all_gather_into_tensor(self, output_tensor, input_tensor, async_op=False):
        for what, t in (("output_tensor", output_tensor), ("input_tensor", input_tensor)):
            check_tensor(t, what, "all_gather_into_tensor", written=what == "output_tensor")
        if output_tensor.dtype != input_tensor.dtype or output_tensor.numel() != input_tensor.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: output {self._desc(output_tensor)} must hold world_size="
                             f"{self._size} x input {self._desc(input_tensor)} of the same dtype")
        output_tensor, input_tensor = output_tensor.detach(), input_tensor.detach()
        input_tensor = read_apart(output_tensor, input_tensor, self._rank, input_tensor)

        common, mine = self._placement(input_tensor)

        def body(_):
            out = contig(output_tensor)
            self._all_gather(out.view(-1), contig(input_tensor).view(-1))
            if out is not output_tensor:
                output_tensor.copy_(out)
            return [output_tensor]
        return self._launch("all_gather_into_tensor", body, async_op, self._desc(input_tensor) + common, mine)

    def all_gather(self, tensor_list, tensor, async_op=False):
        check_tensor(tensor, "tensor", "all_gather")
        if len(tensor_list) != self._size:
            raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} entries, group size is {self._size}")
        for i, t in enumerate(tensor_list):
            check_tensor(t, f"tensor_list[{i}]", "all_gather", written=True)
            if t.dtype != tensor.dtype or t.numel() != tensor.numel():
                raise ValueError(f"all_gather: tensor_list[{i}] is {self._desc(t)}, input is {self._desc(tensor)}")
        tensor, tensor_list = tensor.detach(), [t.detach() for t in tensor_list]
        common, mine = self._placement(tensor)

        def body(_):
            flat = torch.empty(self._size * tensor.numel(), dtype=tensor.dtype)
            self._all_gather(flat, contig(tensor).view(-1))
            for t, piece in zip(tensor_list, flat.chunk(self._size) if tensor.numel() else [flat] * self._size):
                t.copy_(piece.view(t.shape))
            return tensor_list
        return self._launch("all_gather", body, async_op, self._desc(tensor) + common, mine)

    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, async_op=False):
        for what, t in (("output", output), ("input", input)):
            check_tensor(t, what, "reduce_scatter_tensor", written=what == "output")
        op = ReduceOp.of(op)
        check_reduce_dtype(op, input.dtype, "reduce_scatter_tensor")
        if output.dtype != input.dtype or input.numel() != output.numel() * self._size:
            raise ValueError(f"reduce_scatter_tensor: input {self._desc(input)} must hold world_size={self._size} "
                             f"x output {self._desc(output)} of the same dtype")
        output, input = output.detach(), input.detach()
        input = read_apart(input, output, self._rank, input)

        common, mine = self._placement(input)

        def body(_):
            out = contig(output)
            self._reduce_scatter(out.view(-1), contig(input).view(-1), op)
            if out is not output:
                output.copy_(out)
            return [output]
        return self._launch("reduce_scatter_tensor", body, async_op, f"{self._desc(output)}|{op.name}{common}", mine)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, async_op=False):
        for what, t in (("output", output), ("input", input)):
            check_tensor(t, what, "all_to_all_single", written=what == "output")
        check_contiguous(input, "input", "all_to_all_single")
        if output.dtype != input.dtype:
            raise ValueError(f"all_to_all_single: output dtype {output.dtype} != input dtype {input.dtype}")
        if overlap(output, input):  # torch's backends do not support it either (gloo returns garbage)
            raise ValueError("all_to_all_single: output and input share memory; all-to-all cannot run in place")
        output, input = output.detach(), input.detach()
        if input.dim() == 0 or output.dim() == 0:
            raise ValueError("all_to_all_single: input and output need at least one dimension to split")
        row_in, row_out = math.prod(input.shape[1:]), math.prod(output.shape[1:])
        in_splits = self._splits(input, input_split_sizes, "input_split_sizes")
        out_splits = self._splits(output, output_split_sizes, "output_split_sizes")
        # agreed in elements, as torch counts them: rows may differ in shape as long as r sends j what j expects
        sends, takes = [s * row_in for s in in_splits], [s * row_out for s in out_splits]

        def body(infos):
            ins, outs = zip(*([list(map(int, p.split(","))) for p in info.split(";")] for info in infos))
            bad = [(r, j) for r in range(self._size) for j in range(self._size) if ins[r][j] != outs[j][r]]
            if bad:  # every rank sees every rank's counts, so all of them raise together
                r, j = bad[0]
                raise HeaderMismatch(f"all_to_all_single on group {self.group_name!r}: rank {r} sends {ins[r][j]} "
                                     f"elements to rank {j}, which expects {outs[j][r]} (split sizes count slices "
                                     "of dim 0)")
            out = contig(output)
            self._all_to_all(out.view(-1), contig(input).view(-1), takes, sends, max(max(row) for row in ins))
            if out is not output:
                output.copy_(out)
            return [output]
        return self._launch("all_to_all_single", body, async_op, str(input.dtype),
                            f"{','.join(map(str, sends))};{','.join(map(str, takes))}")

    # gather and scatter: rooted collectives ---------------------------------------------------------
    def _rooted_list(self, tensors, tensor, root: int, op_name: str, what: str):
        """Check ``tensors`` as torch does: a list of group-size tensors like ``tensor`` on the root, none elsewhere.
        Returns them and ``tensor``, detached; where one shares memory with ``tensor`` (the root's own block may be
        its tensor, as gloo allows), the side the root reads is a copy."""
        root_arg = "dst" if op_name == "gather" else "src"
        if self._rank != root:
            if tensors:
                raise ValueError(f"{op_name}: {what} must NOT be given on rank {self._rank}, only on the "
                                 f"{root_arg} rank {root}")
            return [], tensor.detach()
        if not tensors or len(tensors) != self._size:
            raise ValueError(f"{op_name}: {what} on {root_arg} rank {root} must list group size={self._size} "
                             f"tensors, got {None if tensors is None else len(tensors)}")
        for i, t in enumerate(tensors):
            check_tensor(t, f"{what}[{i}]", op_name, written=op_name == "gather")
            if t.dtype != tensor.dtype or t.numel() != tensor.numel():
                raise ValueError(f"{op_name}: {what}[{i}] is {self._desc(t)}, tensor is {self._desc(tensor)}")
        tensors, tensor = [t.detach() for t in tensors], tensor.detach()
        if any(overlap(t, tensor) for t in tensors):
            if op_name == "gather":
                tensor = tensor.clone()
            else:
                tensors = [t.clone() if overlap(t, tensor) else t for t in tensors]
        return tensors, tensor

    def gather(self, tensor, gather_list=None, dst=0, async_op=False):
        check_tensor(tensor, "tensor", "gather")
        self._check_root(dst, "dst", "gather")
        gather_list, tensor = self._rooted_list(gather_list, tensor, dst, "gather", "gather_list")

        def body(_):
            outs = [contig(t) for t in gather_list]
            self._gather([o.view(-1) for o in outs], contig(tensor).view(-1), dst)
            for t, o in zip(gather_list, outs):
                if o is not t:
                    t.copy_(o)
            return gather_list if self._rank == dst else []  # torch gloo's future value off the root
        return self._launch("gather", body, async_op, f"{self._desc(tensor)}|dst={dst}")

    def scatter(self, tensor, scatter_list=None, src=0, async_op=False):
        check_tensor(tensor, "tensor", "scatter", written=True)
        self._check_root(src, "src", "scatter")
        scatter_list, tensor = self._rooted_list(scatter_list, tensor, src, "scatter", "scatter_list")

        def body(_):
            out = contig(tensor)
            self._scatter(out.view(-1), [contig(t).view(-1) for t in scatter_list], src)
            if out is not tensor:
                tensor.copy_(out)
            return [tensor]
        return self._launch("scatter", body, async_op, f"{self._desc(tensor)}|src={src}")

    def _splits(self, t: torch.Tensor, sizes, what: str) -> list[int]:
        rows = t.shape[0]
        if sizes is None or len(sizes) == 0:
            if rows % self._size:
                raise ValueError(f"all_to_all_single: dim 0 ({rows}) is not divisible by group size {self._size}; "
                                 f"pass {what}")
            return [rows // self._size] * self._size
        if any(isinstance(s, bool) or not hasattr(s, "__index__") for s in sizes):
            raise TypeError(f"all_to_all_single: {what} must be a list of ints, got {sizes!r}")
        sizes = [operator.index(s) for s in sizes]
        if len(sizes) != self._size or any(s < 0 for s in sizes) or sum(sizes) != rows:
            raise ValueError(f"all_to_all_single: {what}={sizes} must have {self._size} non-negative entries "
                             f"summing to dim 0 ({rows})")
        return sizes

    def barrier(self, async_op=False, device_ids=None, timeout=None):  # CPU only: no device to pick
        def run(_):
            self._barrier()
            return []  # what torch's barrier future holds
        return self._launch("barrier", run, async_op, timeout=timeout)

    def send(self, tensor, dst, tag=0):
        check_tensor(tensor, "tensor", "send")
        self._check_root(dst, "dst", "send")
        tag = check_tag(tag, "send")
        if dst == self._rank:
            raise ValueError(f"send: dst={dst} is this rank")
        return self._p2p("send", contig(tensor.detach()), dst, tag)

    def recv(self, tensor, src, tag=0):
        """``src=None``: from whichever rank sends ``tag`` first."""
        check_tensor(tensor, "tensor", "recv", written=True)
        if src is not None:
            self._check_root(src, "src", "recv")
        tag = check_tag(tag, "recv")
        if src == self._rank or (src is None and self._size == 1):
            raise ValueError(f"recv: src={src} is this rank" if src is not None else "recv: no other rank to receive "
                             "from in a group of one")
        buf = contig(tensor := tensor.detach())
        return self._p2p("recv", buf, src, tag, None if buf is tensor else tensor)

    def shutdown(self) -> None:
        self._queue.shutdown()
