"""The ``"tcp"`` backend: ring collectives over the socket mesh, written from scratch (gloo's algorithms).

Ring all-reduce (Patarasuk & Yuan 2009; gloo's ``AllreduceRing``, Horovod/Baidu ring) is a ring
reduce-scatter followed by a ring all-gather. The tensor is cut into N blocks; in each of N-1 steps
every rank sends one block to its right neighbour while receiving one from its left and folding it in,
so after the first phase rank r holds the fully reduced block r; N-1 more steps circulate the finished
blocks. Each rank sends 2(N-1)/N of the tensor in total, independent of N, which is why rings are
bandwidth-optimal. Steps are cut into sub-chunks so the reduction of one chunk overlaps the transfer
of the next, and bytes land with ``recv_into`` straight in the output (all-gather) or a preallocated
scratch buffer (reduce-scatter).
"""

from __future__ import annotations

import torch

from pt_dist.backends.base import NativeProcessGroup
from pt_dist.backends.mesh import PeerMesh
from pt_dist.process_group import ReduceOp, combine_, finish_avg_
from pt_dist.wire import byte_view

CHUNK_BYTES = 1 << 20


def _pieces(block: torch.Tensor, k: int) -> list[torch.Tensor]:
    return list(torch.tensor_split(block, k)) if k > 1 else [block]


class ProcessGroupTCP(NativeProcessGroup):
    """Ring algorithms over authenticated sockets; works across hosts (pass ``host``, the address to listen on)."""

    def __init__(self, store, rank: int, size: int, timeout: float, group_name: str = "", secret: bytes = b"",
                 host: str = "127.0.0.1"):
        super().__init__(rank, size, timeout, group_name)
        self.mesh = PeerMesh(store, rank, size, secret, timeout, group_name, host)
        self.right, self.left = (rank + 1) % size, (rank - 1) % size
        self._buffers: list[torch.Tensor] = []

    def name(self) -> str:
        return "tcp"

    def _exchange_headers(self, header, op_name):
        return self.mesh.exchange_headers(op_name, header)

    def _abort(self) -> None:
        self.mesh.close()

    def shutdown(self) -> None:
        super().shutdown()
        self.mesh.close()

    def _scratch(self, k: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Receive buffers kept between calls: fresh pages would cost a kernel zero-fill on every large op."""
        nbytes = numel * dtype.itemsize
        if len(self._buffers) <= k:
            self._buffers.append(torch.empty(0, dtype=torch.uint8))
        if self._buffers[k].numel() < nbytes:
            self._buffers[k] = torch.empty(nbytes, dtype=torch.uint8)
        return self._buffers[k][:nbytes].view(dtype)

    def _split_count(self, longest_block: int, itemsize: int) -> int:
        return max(1, -(-longest_block * itemsize // CHUNK_BYTES))

    def _ring_reduce_scatter(self, op_name: str, blocks, out_blocks, op: ReduceOp) -> None:
        """After N-1 steps ``out_blocks[rank]`` holds the reduction of every rank's ``blocks[rank]``.

        In place when ``out_blocks is blocks`` (all-reduce); otherwise partial sums ping-pong between
        two scratch buffers so the input stays untouched (reduce-scatter). Each step is one streaming
        ``sendrecv``; every ``CHUNK_BYTES`` that land are folded in while the rest is still in flight.
        An output that is the input's own block (NCCL's in-place reduce-scatter) takes the last step in
        place too: the partial sum lands in scratch and is folded into the block.
        """
        n, r = self._size, self._rank
        longest = max(b.numel() for b in blocks)
        item = blocks[0].element_size()
        in_place = out_blocks is blocks
        own_block = not in_place and out_blocks[r].data_ptr() == blocks[r].data_ptr()
        scratch = [self._scratch(k, longest, blocks[0].dtype) for k in range(1 if in_place else 2)]
        sending = blocks[(r - 1) % n]
        for step in range(n - 1):
            b = (r - step - 2) % n
            fold_in_place = in_place or (own_block and step == n - 2)
            if in_place:
                target = blocks[b]
            elif step == n - 2:
                target = out_blocks[r]
            else:
                target = scratch[step % 2][: blocks[b].numel()]
            # (in the last step scratch[step % 2] is free: the buffer being sent is the other one)
            recv_buf = scratch[step % 2 if own_block else 0][: blocks[b].numel()] if fold_in_place else target
            other = recv_buf if fold_in_place else blocks[b]

            def fold(lo, hi, target=target, other=other):
                combine_(target[lo // item:hi // item], other[lo // item:hi // item], op)

            self.mesh.sendrecv(op_name, self.right, byte_view(sending), self.left, byte_view(recv_buf),
                               chunk=CHUNK_BYTES - CHUNK_BYTES % item, on_chunk=fold)
            sending = target

    def _ring_all_gather(self, op_name: str, blocks) -> None:
        """Rank r starts with ``blocks[r]`` complete; N-1 steps later every block is everywhere."""
        n, r = self._size, self._rank
        for step in range(n - 1):
            self.mesh.sendrecv(op_name, self.right, byte_view(blocks[(r - step) % n]), self.left,
                               byte_view(blocks[(r - step - 1) % n]))

    def _all_reduce(self, t, op):
        if self._size == 1 or t.numel() == 0:
            return
        blocks = list(torch.tensor_split(t, self._size))
        self._ring_reduce_scatter("all_reduce", blocks, blocks, op)
        finish_avg_(blocks[self._rank], op, self._size)
        self._ring_all_gather("all_reduce", blocks)

    def _reduce(self, t, dst, op):
        if self._size == 1 or t.numel() == 0:
            return
        work = t if self._rank == dst else t.clone()
        blocks = list(torch.tensor_split(work, self._size))
        self._ring_reduce_scatter("reduce", blocks, blocks, op)
        finish_avg_(blocks[self._rank], op, self._size)
        for peer in range(self._size):  # gather the finished blocks at dst
            if self._rank == dst and peer != dst:
                self.mesh.sendrecv("reduce", None, None, peer, byte_view(blocks[peer]))
            elif self._rank == peer != dst:
                self.mesh.sendrecv("reduce", dst, byte_view(blocks[peer]), None, None)

    def _reduce_scatter(self, out, inp, op):
        blocks = list(inp.chunk(self._size)) if out.numel() else [out] * self._size
        if self._size == 1 or out.numel() == 0:
            out.copy_(blocks[0])
            return finish_avg_(out, op, self._size)
        out_blocks = [None] * self._size
        out_blocks[self._rank] = out
        self._ring_reduce_scatter("reduce_scatter_tensor", blocks, out_blocks, op)
        finish_avg_(out, op, self._size)

    def _all_gather(self, out, inp):
        if inp.numel() == 0:
            return
        blocks = list(out.chunk(self._size))
        blocks[self._rank].copy_(inp)
        self._ring_all_gather("all_gather", blocks)

    def _broadcast(self, t, src):
        """Pipelined ring from ``src``: while forwarding chunk i, receive chunk i+1."""
        if self._size == 1 or t.numel() == 0:
            return
        pos = (self._rank - src) % self._size
        chunks = _pieces(t, self._split_count(t.numel(), t.element_size()))
        last = pos == self._size - 1
        for i in range(len(chunks) + 1):
            send = byte_view(chunks[i - 1]) if i >= 1 and not last else None
            recv = byte_view(chunks[i]) if i < len(chunks) and pos != 0 else None
            self.mesh.sendrecv("broadcast", self.right, send, self.left, recv)

    def _all_to_all(self, out, inp, out_splits, in_splits, longest):
        """Pairwise exchange: in step k send to rank+k while receiving from rank-k (no ring hops)."""
        n, r = self._size, self._rank
        out_blocks = list(torch.split(out, out_splits))
        in_blocks = list(torch.split(inp, in_splits))
        out_blocks[r].copy_(in_blocks[r])
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            self.mesh.sendrecv("all_to_all_single", dst, byte_view(in_blocks[dst]), src, byte_view(out_blocks[src]))

    def _gather(self, outs, inp, dst):
        """Straight to the root, which receives each peer's input into that peer's output tensor in turn."""
        if self._rank != dst:
            return self.mesh.sendrecv("gather", dst, byte_view(inp), None, None)
        outs[dst].copy_(inp)
        for j in range(self._size):
            if j != dst:
                self.mesh.sendrecv("gather", None, None, j, byte_view(outs[j]))

    def _scatter(self, out, ins, src):
        """Straight from the root, which sends each rank its piece in turn."""
        if self._rank != src:
            return self.mesh.sendrecv("scatter", None, None, src, byte_view(out))
        out.copy_(ins[src])
        for j in range(self._size):
            if j != src:
                self.mesh.sendrecv("scatter", j, byte_view(ins[j]), None, None)

    def _barrier(self):
        """The header exchange every collective starts with already needs all ranks present."""

    def _p2p(self, kind, t, peer, tag, copy_back=None):
        return self.mesh.p2p(kind, t, peer, tag, copy_back)
