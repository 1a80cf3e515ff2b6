"""The ``"tcp"`` backend: gloo's ring collectives (``ring.py``) over the socket mesh (``peer_mesh.py``).

This file is glue, as ``ProcessGroupGloo`` is around gloo's algorithms: it gives the ring a ``sendrecv`` to its
neighbours (streaming ``recv_into`` straight into the output or a kept scratch buffer, folding each
``CHUNK_BYTES`` that lands while the rest is in flight), and runs the collectives that are no ring: the rooted
ones straight to or from the root, all-to-all as pairwise exchanges.
"""

from __future__ import annotations

import torch

from pt_dist._infra.wire import byte_view
from pt_dist.backends import ring
from pt_dist.backends.base import NativeProcessGroup
from pt_dist.backends.peer_mesh import PeerMesh
from pt_dist.process_group import finish_avg_

CHUNK_BYTES = 1 << 20


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

    def _ring(self, op_name: str):
        """The ring's ``sendrecv``: to the right neighbour, from the left, folding by element ranges."""
        def sendrecv(send, recv, on_chunk=None):
            if send is None and recv is None:  # (a broadcast step with nothing to pass on)
                return
            item = (send if send is not None else recv).element_size()
            fold = None if on_chunk is None else (lambda lo, hi: on_chunk(lo // item, hi // item))
            self.mesh.sendrecv(op_name, self.right, None if send is None else byte_view(send), self.left,
                               None if recv is None else byte_view(recv), CHUNK_BYTES - CHUNK_BYTES % item, fold)
        return sendrecv

    def _all_reduce(self, t, op):
        if self._size == 1 or t.numel() == 0:
            return
        scratch = self._scratch(0, -(-t.numel() // self._size), t.dtype)
        ring.all_reduce(t, self._rank, self._size, op, self._ring("all_reduce"), scratch)

    def _reduce(self, t, dst, op):
        """The ring's reduce-scatter on a copy (off the root: the input stays as it was), then the finished blocks
        straight to ``dst``."""
        if self._size == 1 or t.numel() == 0:
            return
        work = t if self._rank == dst else t.clone()
        blocks = list(torch.tensor_split(work, self._size))
        scratch = self._scratch(0, blocks[0].numel(), t.dtype)
        ring.reduce_scatter_in_place(blocks, self._rank, self._size, op, self._ring("reduce"), scratch)
        finish_avg_(blocks[self._rank], op, self._size)
        for peer in range(self._size):
            if self._rank == dst and peer != dst:
                self.mesh.sendrecv("reduce", None, None, peer, byte_view(blocks[peer]))
            elif self._rank == peer != dst:
                self.mesh.sendrecv("reduce", dst, byte_view(blocks[peer]), None, None)

    def _reduce_scatter(self, out, inp, op):
        blocks = list(inp.chunk(self._size)) if out.numel() else [out] * self._size
        if self._size == 1 or out.numel() == 0:
            out.copy_(blocks[0])
            return finish_avg_(out, op, self._size)
        scratch = [self._scratch(k, out.numel(), out.dtype) for k in (0, 1)]
        ring.reduce_scatter(blocks, out, self._rank, self._size, op, self._ring("reduce_scatter_tensor"), scratch)
        finish_avg_(out, op, self._size)

    def _all_gather(self, out, inp):
        if inp.numel() == 0:
            return
        blocks = list(out.chunk(self._size))
        blocks[self._rank].copy_(inp)
        ring.all_gather(blocks, self._rank, self._size, self._ring("all_gather"))

    def _broadcast(self, t, src):
        if self._size == 1 or t.numel() == 0:
            return
        pieces = max(1, -(-t.numel() * t.element_size() // CHUNK_BYTES))
        chunks = list(torch.tensor_split(t, pieces)) if pieces > 1 else [t]
        ring.broadcast(chunks, self._rank, src, self._size, self._ring("broadcast"))

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
