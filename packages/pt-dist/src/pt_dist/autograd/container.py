"""Distributed autograd contexts: torch's ``DistAutogradContainer`` and ``DistAutogradContext``.

torch/csrc/distributed/autograd/context/{container,context}.h. A context groups one iteration's RPCs: ids
are ``rank << 48 | counter`` so they are unique across workers; the callee of an RPC made inside a context
creates the same id on receipt and runs the call inside it (``agent._serve``). A context keeps the tensors
each send carried (so backward can start from them), the gradients accumulated on this worker (never in
``.grad``: two contexts training the same parameters stay apart) and the workers it talked to, so releasing
it releases it there too (torch's ``CleanupAutogradContextReq``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading

import torch

log = logging.getLogger(__name__)

_lock = threading.Lock()
_contexts: dict[int, DistAutogradContext] = {}
_local = threading.local()
_counter = itertools.count(1)
_send_ids = itertools.count(1)
_rpc_agent = None  # the agent that carries this worker's RPCs (init)


class DistAutogradContext:
    """One context on this worker: sends by id, accumulated gradients, known workers."""

    def __init__(self, context_id: int):
        self.context_id = context_id
        self._lock = threading.Lock()
        self.sends: dict[int, list[torch.Tensor]] = {}
        self.recv_anchors: dict[int, torch.Tensor] = {}  # id(anchor leaf) -> the leaf (kept alive here)
        self.grads: dict[torch.Tensor, torch.Tensor] = {}
        self.known_workers: set[int] = set()

    def record_send(self, tensors: list[torch.Tensor], dst: int) -> int:
        """Keep ``tensors`` (sent to ``dst``) as the roots a gradient for send ``id`` will flow back into."""
        msg_id = next(_send_ids)
        with self._lock:
            self.sends[msg_id] = tensors
            self.known_workers.add(dst)
        return msg_id

    def add_known_worker(self, worker: int) -> None:
        with self._lock:
            self.known_workers.add(worker)

    def accumulate(self, tensor: torch.Tensor, grad: torch.Tensor) -> None:
        with self._lock:
            have = self.grads.get(tensor)
            self.grads[tensor] = grad.detach().clone() if have is None else have + grad

    def _known_workers(self) -> list[int]:
        with self._lock:
            return sorted(self.known_workers)


def init(agent) -> None:
    """Bind distributed autograd to this worker's RPC agent (torch's ``dist_autograd._init(worker_id)``, which
    ``init_rpc`` calls; ``shutdown`` unbinds it with None): context ids take its rank, releases and gradients
    travel through it."""
    global _rpc_agent
    _rpc_agent = agent


def rpc_agent():
    if _rpc_agent is None:
        raise RuntimeError("RPC has not been initialized. Call pt_dist.rpc.init_rpc first.")
    return _rpc_agent


def get_or_create(context_id: int, src: int | None = None) -> DistAutogradContext:
    with _lock:
        ctx = _contexts.get(context_id)
        if ctx is None:
            ctx = _contexts[context_id] = DistAutogradContext(context_id)
    if src is not None:
        ctx.add_known_worker(src)
    return ctx


def retrieve(context_id: int) -> DistAutogradContext:
    with _lock:
        ctx = _contexts.get(context_id)
    if ctx is None:
        raise RuntimeError(f"Could not find autograd context with id: {context_id}")
    return ctx


def current_context() -> DistAutogradContext | None:
    return getattr(_local, "ctx", None)


@contextlib.contextmanager
def current(ctx: DistAutogradContext | None):
    """Make ``ctx`` this thread's context for the block (the callee's side of an RPC made in a context)."""
    before = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = before


def release(context_id: int, skip: int | None = None) -> None:
    """Drop the context here and ask the workers it talked to to drop it too (asynchronously)."""
    with _lock:
        ctx = _contexts.pop(context_id, None)
    if ctx is None:
        return
    agent = rpc_agent()
    for w in ctx._known_workers():
        if w not in (skip, agent.rank):
            try:
                agent.request(w, ("cleanup", context_id))
            except RuntimeError as e:
                log.debug("autograd context %d: no cleanup on worker %d: %s", context_id, w, e)


class context:
    """``with pt_dist.autograd.context() as context_id:`` as torch.distributed.autograd.context."""

    def __enter__(self) -> int:
        if current_context() is not None:
            raise RuntimeError("Already have an autograd context id for this thread.")
        rank = rpc_agent().rank
        self._ctx = get_or_create((rank << 48) | next(_counter))
        self._token = current(self._ctx)
        self._token.__enter__()
        return self._ctx.context_id

    def __exit__(self, *exc) -> None:
        self._token.__exit__(*exc)
        release(self._ctx.context_id)


def get_gradients(context_id: int) -> dict[torch.Tensor, torch.Tensor]:
    """The gradients this worker accumulated in context ``context_id``: ``{tensor: grad}``."""
    ctx = retrieve(context_id)
    with ctx._lock:
        return dict(ctx.grads)
