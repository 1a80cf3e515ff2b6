"""Ring collectives as plain functions: gloo's ``AllreduceRing`` (gloo/allreduce_ring.h; Patarasuk & Yuan 2009).

Cut the tensor into N blocks, one per rank. **Reduce-scatter**: in each of N-1 steps every rank sends one block to
its right neighbour while receiving another from its left and folding it in; after them rank r holds block r
reduced over all ranks. **All-gather**: N-1 more steps pass the finished blocks around. Each rank sends 2(N-1)/N
of the tensor whatever N is, which is why the ring is bandwidth-optimal.

Every function here only calls ``sendrecv(send, recv, on_chunk=None)``: stream tensor ``send`` to the right
neighbour while filling tensor ``recv`` from the left one (either may be None), calling ``on_chunk(lo, hi)`` for
each element range of ``recv`` as it lands, so folding overlaps the rest of the transfer. ``tcp.py`` gives it
sockets; nothing here knows about them.
"""

from __future__ import annotations

import torch

from pt_dist.process_group import ReduceOp, combine_, finish_avg_


def all_reduce(t: torch.Tensor, rank: int, size: int, op: ReduceOp, sendrecv, scratch: torch.Tensor) -> None:
    """In place: the ring reduce-scatter, then the ring all-gather. ``scratch`` holds the largest block."""
    blocks = list(torch.tensor_split(t, size))
    reduce_scatter_in_place(blocks, rank, size, op, sendrecv, scratch)
    finish_avg_(blocks[rank], op, size)
    all_gather(blocks, rank, size, sendrecv)


def reduce_scatter_in_place(blocks, rank: int, size: int, op: ReduceOp, sendrecv, scratch: torch.Tensor) -> None:
    """Afterwards ``blocks[rank]`` holds that block reduced over every rank (the other blocks hold partial sums).

    Step s sends the block folded in the step before (at first: the left neighbour's, untouched) and folds the
    incoming copy of block ``rank - s - 2`` into this rank's own."""
    for step in range(size - 1):
        send, fold = blocks[(rank - step - 1) % size], blocks[(rank - step - 2) % size]
        incoming = scratch[:fold.numel()]
        sendrecv(send, incoming, lambda lo, hi, f=fold, i=incoming: combine_(f[lo:hi], i[lo:hi], op))


def all_gather(blocks, rank: int, size: int, sendrecv) -> None:
    """Rank r starts with ``blocks[r]`` complete; N-1 steps later every block is everywhere."""
    for step in range(size - 1):
        sendrecv(blocks[(rank - step) % size], blocks[(rank - step - 1) % size])


def reduce_scatter(blocks, out: torch.Tensor, rank: int, size: int, op: ReduceOp, sendrecv, scratch) -> None:
    """Out of place: ``out`` = ``blocks[rank]`` reduced over every rank, the input ``blocks`` left untouched.

    Partial sums ping-pong between the two ``scratch`` buffers (each a block long); the last one lands in ``out``.
    Where ``out`` is the input's own block (NCCL's in-place form) the last partial sum lands in scratch and is
    folded into it (the buffer being sent then is the other one)."""
    own = out.data_ptr() == blocks[rank].data_ptr()
    send = blocks[(rank - 1) % size]
    for step in range(size - 1):
        block = blocks[(rank - step - 2) % size]
        last = step == size - 2
        if last and own:
            incoming = scratch[step % 2][:block.numel()]
            sendrecv(send, incoming, lambda lo, hi, incoming=incoming: combine_(out[lo:hi], incoming[lo:hi], op))
            return
        partial = out if last else scratch[step % 2][:block.numel()]
        sendrecv(send, partial, lambda lo, hi, p=partial, b=block: combine_(p[lo:hi], b[lo:hi], op))
        send = partial


def broadcast(chunks, rank: int, src: int, size: int, sendrecv) -> None:
    """Pipelined ring from ``src``: while forwarding chunk i to the right, receive chunk i+1 from the left."""
    pos = (rank - src) % size
    last = pos == size - 1
    for i in range(len(chunks) + 1):
        send = chunks[i - 1] if i >= 1 and not last else None
        recv = chunks[i] if i < len(chunks) and pos != 0 else None
        sendrecv(send, recv)
