"""Backward across workers: torch's ``DistEngine`` in FAST mode (torch/csrc/distributed/autograd/engine/).

``backward(context_id, roots)`` runs one local pass: find every leaf the roots reach (parameters, and the
anchors of recv functions: functions.py) and run the engine to them, each leaf's gradient going to the
context instead of ``.grad``, its ``AccumulateGrad`` hooks run (capture.py). Each recv function reached
sends its gradients to the worker that sent those tensors, which runs the same pass from the tensors it sent
(the ``"grad"`` handler) and answers once its own pass, and every pass it started in turn, is done (the
handler returns a Future, so no pool thread is held while the passes it started run elsewhere). So the caller's
``backward`` returns when the whole distributed graph has run. Passes that start from a send keep the graph
(``retain_graph``): several sends may share it; the context's release frees it.
"""

from __future__ import annotations

import torch

from pt_dist.autograd import container as _context
from pt_dist.autograd.capture import LeafCapture
from pt_dist.autograd.functions import _pass


def _reachable_leaves(roots: list[torch.Tensor]) -> tuple[list[torch.Tensor], list]:
    """Every leaf the roots reach and its ``AccumulateGrad`` node (a root that is a leaf: its own)."""
    leaves, nodes, seen, stack = [], [], set(), []
    for r in roots:
        if r.grad_fn is None:
            if r.requires_grad and id(r) not in seen:
                seen.add(id(r))
                leaves.append(r)
                nodes.append(torch.autograd.graph.get_gradient_edge(r).node)
        else:
            stack.append(r.grad_fn)
    visited = set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in visited:
            continue
        visited.add(fn)
        var = getattr(fn, "variable", None)  # AccumulateGrad
        if var is not None:
            if id(var) not in seen:
                seen.add(id(var))
                leaves.append(var)
                nodes.append(fn)
            continue
        stack.extend(f for f, _ in fn.next_functions)
    return leaves, nodes


def _run_pass(ctx, roots, grads, retain_graph: bool) -> list:
    """One local backward; returns the Futures of the gradients it sent on (none is waited for here)."""
    leaves, nodes = _reachable_leaves(roots)
    if not leaves:
        return []
    outer = getattr(_pass, "futures", None)
    _pass.futures = []
    try:
        with LeafCapture(ctx, leaves, nodes, ctx.recv_anchors), _context.current(ctx):
            torch.autograd.backward(roots, grads, retain_graph=retain_graph, inputs=leaves)
        return _pass.futures
    finally:
        _pass.futures = outer


def _all(futures: list):
    """A Future done when every one of ``futures`` is, failing with the first failure."""
    return torch.futures.collect_all(futures).then(lambda f: [x.wait() for x in f.wait()] and None)


def backward(context_id: int, roots: list[torch.Tensor], retain_graph: bool = False) -> None:
    """torch.distributed.autograd.backward: run backward from scalar ``roots`` across every worker involved
    (``pt_dist.autograd.backward`` checks the arguments first: pt_dist/_compat/autograd/backward.py)."""
    ctx = _context.retrieve(context_id)
    futures = _run_pass(ctx, list(roots), [torch.ones_like(r) for r in roots], retain_graph)
    if futures:
        _all(futures).wait()


def on_grad(src: int, context_id: int, send_id: int, grads: list):
    """The ``"grad"`` handler: run backward from the tensors of send ``send_id`` with the gradients received;
    answered (a Future: no pool thread waits) once the passes it started elsewhere are done."""
    ctx = _context.retrieve(context_id)
    sent = ctx.sends.get(send_id)
    if sent is None:
        raise RuntimeError(f"no send {send_id} in autograd context {context_id} on this worker")
    pairs = [(t, g) for t, g in zip(sent, grads) if g is not None]
    futures = _run_pass(ctx, [t for t, _ in pairs], [g for _, g in pairs], retain_graph=True) if pairs else []
    return _all(futures) if futures else None


def on_cleanup(src: int, context_id: int) -> None:
    _context.release(context_id, skip=src)
