"""The recv autograd function: torch's ``RecvRpcBackward`` (torch/csrc/distributed/autograd/functions/).

A message from another worker that carried tensors requiring grad arrives with the sender's send id. The
received tensors become the outputs of ``RecvRpcBackward`` applied to a fresh empty leaf (the anchor, kept by
the context so the engine can aim at it): when backward reaches it, its ``backward`` sends the incoming
gradients to the sender as ``("grad", context, send id, grads)`` and the sender runs backward from the tensors
it sent (engine.py). The send side needs no node of its own here: the context keeps the sent tensors, which
is what torch's ``SendRpcBackward`` holds edges to.
"""

from __future__ import annotations

import threading

import torch

from pt_dist.autograd import container as _context

_pass = threading.local()  # the engine's pass on this thread: where recv nodes leave their futures


class RecvRpcBackward(torch.autograd.Function):
    """Forward: the received tensors, unchanged. Backward: their gradients go back to the sender."""

    @staticmethod
    def forward(ctx, meta, anchor, *tensors):
        ctx.meta = meta
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        context_id, src, send_id = ctx.meta
        futures = getattr(_pass, "futures", None)
        if futures is None:
            raise RuntimeError("RecvRpcBackward reached outside pt_dist.autograd.backward (use the "
                               "distributed backward, not loss.backward(), for a graph that spans RPCs)")
        futures.append(_context.rpc_agent().request(src, ("grad", context_id, send_id, list(grads))))
        return (None, torch.zeros(0), *([None] * len(grads)))


def attach_recv(context_id: int, src: int, send_id: int, tensors: list, mask: list) -> list:
    """``tensors`` with those that required grad at the sender replaced by ``RecvRpcBackward`` outputs."""
    ctx = _context.get_or_create(context_id, src)
    anchor = torch.empty(0, requires_grad=True)
    with ctx._lock:
        ctx.recv_anchors[id(anchor)] = anchor
    picked = [t for t, rg in zip(tensors, mask) if rg]
    with torch.enable_grad():
        outs = iter(RecvRpcBackward.apply((context_id, src, send_id), anchor, *picked))
    return [next(outs) if rg else t for t, rg in zip(tensors, mask)]
