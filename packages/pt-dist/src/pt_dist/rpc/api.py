"""The user-facing calls of ``torch.distributed.rpc`` (torch/distributed/rpc/api.py and __init__.py).

``init_rpc`` rendezvous (``init_method`` or a given store), starts this worker's agent (agent.py) and returns
when every worker is connected. ``rpc_async`` sends ``("call", fn, args, kwargs)`` and returns the agent's
``torch.futures.Future``; ``rpc_sync`` waits on it; ``remote`` sends ``("remote", ...)`` with a fresh RRef id
and returns the user RRef at once. ``shutdown(graceful=True)`` waits for every worker's outstanding work
(join.py) before closing; ``graceful=False`` closes at once and fails what is pending.
"""

from __future__ import annotations

import logging
import threading

from pt_dist.rpc import handlers, join
from pt_dist.rpc.agent import RpcAgent
from pt_dist.rpc.options import UNSET_RPC_TIMEOUT, TensorPipeRpcBackendOptions, WorkerInfo

log = logging.getLogger(__name__)

_agent: RpcAgent | None = None
_owned_store = None
_lock = threading.Lock()


def _register(agent: RpcAgent) -> None:
    global _agent
    _agent = agent


def _require_agent() -> RpcAgent:
    if _agent is None:
        raise RuntimeError("RPC has not been initialized. Call pt_dist.rpc.init_rpc first.")
    return _agent


def init_rpc(name: str, backend=None, rank: int = -1, world_size: int | None = None,
             rpc_backend_options: TensorPipeRpcBackendOptions | None = None) -> None:
    """Start this worker's agent and connect to every other worker (``backend`` is accepted for torch's
    signature; there is one)."""
    global _agent, _owned_store
    options = rpc_backend_options or TensorPipeRpcBackendOptions()
    with _lock:
        if _agent is not None:
            raise RuntimeError("RPC is already initialized")
        store = options.store
        if store is None:
            from pt_dist._infra.rendezvous import rendezvous

            rdzv = rendezvous(options.init_method, rank, -1 if world_size is None else world_size,
                              timeout=options.rpc_timeout or 300.0)
            store, rank, world_size = rdzv.store, rdzv.rank, rdzv.world_size
            _owned_store = store
        if rank < 0 or world_size is None or not 0 <= rank < world_size:
            raise ValueError(f"init_rpc needs 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        try:
            RpcAgent(name, rank, world_size, store, options, register=_register)
        except BaseException:
            _agent = None
            raise


def shutdown(graceful: bool = True, timeout: float = 0) -> None:
    """Stop RPC here; with ``graceful``, first wait until no worker has work outstanding (every worker must
    call it). ``timeout`` (seconds; 0: the agent's ``rpc_timeout``) bounds that wait."""
    global _agent, _owned_store
    agent = _require_agent()
    try:
        if graceful:
            join.graceful(agent, timeout or agent.options.rpc_timeout or 300.0)
    finally:
        agent.close()
        with _lock:
            _agent = None
            store, _owned_store = _owned_store, None
        if store is not None and hasattr(store, "close"):
            store.close()


def _to_rank(to) -> int:
    """The rank of ``to`` (a name, an id or a ``WorkerInfo``); RuntimeError for none, as torch's agent."""
    agent = _require_agent()
    if isinstance(to, WorkerInfo):
        to = to.id
    if isinstance(to, int):
        if not 0 <= to < agent.world_size:
            raise RuntimeError(f"Invalid destination worker id {to}: could not find destination "
                               f"(world size {agent.world_size})")
        return to
    for w in agent.workers:
        if w.name == to:
            return w.id
    raise RuntimeError(f"name:{to} could not find destination: unknown worker name")


def get_rpc_timeout() -> float:
    """The default timeout of RPCs started from now on, in seconds (torch's ``get_rpc_timeout``)."""
    return float(_require_agent().options.rpc_timeout)


def _set_rpc_timeout(rpc_timeout: float) -> None:
    """Set the default timeout (seconds; 0: none) of RPCs started from now on (torch's ``_set_rpc_timeout``);
    calls already in flight keep theirs."""
    if rpc_timeout < 0:
        raise ValueError(f"rpc_timeout must be >= 0 seconds, got {rpc_timeout}")
    _require_agent().options.rpc_timeout = float(rpc_timeout)


def get_worker_info(worker_name: str | None = None) -> WorkerInfo:
    """This worker's ``WorkerInfo``, or the one named ``worker_name``."""
    agent = _require_agent()
    return agent.info if worker_name is None else agent.workers[_to_rank(worker_name)]


def _current_ctx():
    from pt_dist.autograd import container as context

    return context.current_context()


def rpc_async(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """Run ``func(*args, **kwargs)`` on worker ``to`` (name, id or ``WorkerInfo``); a Future of its result.
    ``timeout`` in seconds (unset: the agent's ``rpc_timeout``; 0: none)."""
    return _require_agent().request(_to_rank(to), ("call", func, tuple(args or ()), dict(kwargs or {})),
                                    timeout, _current_ctx())


def rpc_sync(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """``rpc_async(...).wait()``: the result, or the remote exception re-raised here."""
    return rpc_async(to, func, args, kwargs, timeout).wait()


def remote(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """Run ``func`` on ``to`` and keep the result there; returns a user ``RRef`` to it at once."""
    from pt_dist.rpc.rref import RRef

    agent = _require_agent()
    dst = _to_rank(to)
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    rref_id = agent.rrefs.new_id()
    if dst == agent.rank:
        rref = agent.rrefs.owner_rref(rref_id)
        agent.submit(_run_local, rref, func, args, kwargs, _current_ctx())
        return rref
    rref = RRef._make(agent, dst, rref_id, rref_id)
    rref._creation = agent.request(dst, ("remote", func, args, kwargs, rref_id, rref_id), timeout, _current_ctx())
    agent.rrefs.creating(rref_id, rref, rref._creation)
    return rref


def _run_local(rref, func, args, kwargs, ctx) -> None:
    from pt_dist.autograd import container

    with container.current(ctx):  # the caller's context, as a call to another worker runs in
        handlers.run_into(rref, func, args, kwargs)


def _rref_context_get_debug_info() -> dict[str, int]:
    """The owner-side counts (torch's ``_rref_context_get_debug_info``): ``num_owner_rrefs``, ``num_forks``..."""
    return _require_agent().rrefs.debug_info()
