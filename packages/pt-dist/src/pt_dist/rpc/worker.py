"""This process as an RPC worker: ``init_rpc`` joins the job, ``rpc_sync`` / ``rpc_async`` / ``remote`` call other
workers, ``shutdown`` leaves (torch/distributed/rpc/api.py, and ``init_rpc`` from its __init__.py).

``init_rpc`` rendezvous (``init_method`` or a given store), starts this worker's agent (agent.py) and returns
when every worker is connected. ``rpc_async`` sends ``("call", fn, args, kwargs)`` and returns the agent's
``torch.futures.Future``; ``rpc_sync`` waits on it; ``remote`` asks the RRef context (rref_context.py) for a
fresh RRef whose owner runs the function into it, and returns it at once. ``shutdown(graceful=True)`` waits for
every worker's outstanding work (pt_dist/_infra/rpc_join.py) before closing; ``graceful=False`` closes at once
and fails what is pending. ``pt_dist.rpc.api`` re-exports these under torch's names; the modules below find
the agent through rpc_agent.py, never through this one.
"""

from __future__ import annotations

import threading

from pt_dist._infra import rpc_join
from pt_dist._infra.rendezvous import rendezvous
from pt_dist.autograd import container
from pt_dist.rpc import handlers
from pt_dist.rpc.agent import RpcAgent
from pt_dist.rpc.options import UNSET_RPC_TIMEOUT, TensorPipeRpcBackendOptions, WorkerInfo
from pt_dist.rpc.rpc_agent import get_current_rpc_agent, is_current_rpc_agent_set, set_current_rpc_agent
from pt_dist.rpc.rref import RRef
from pt_dist.rpc.rref_context import RRefContext

_owned_store = None  # the store init_rpc made from init_method (closed by shutdown)
_lock = threading.Lock()


def _init_rpc_states(agent: RpcAgent, rref_class: type[RRef]) -> None:
    """What a worker needs before any peer can reach it (torch's ``api._init_rpc_states`` and
    ``dist_autograd._init``): the RRef context, the handlers, and this agent as the process's."""
    agent.rrefs = RRefContext(agent, rref_class)
    handlers.install(agent)
    container.init(agent)
    set_current_rpc_agent(agent)


def init_rpc(name: str, rank: int = -1, world_size: int | None = None,
             rpc_backend_options: TensorPipeRpcBackendOptions | None = None, rref_class: type[RRef] = RRef) -> None:
    """Start this worker's agent and connect to every other worker; the RRefs it makes are ``rref_class``."""
    global _owned_store
    options = rpc_backend_options or TensorPipeRpcBackendOptions()
    with _lock:
        if is_current_rpc_agent_set():
            raise RuntimeError("RPC is already initialized")
        store = options.store
        if store is None:
            rdzv = rendezvous(options.init_method, rank, -1 if world_size is None else world_size,
                              timeout=options.rpc_timeout or 300.0)
            store, rank, world_size = rdzv.store, rdzv.rank, rdzv.world_size
            _owned_store = store
        if rank < 0 or world_size is None or not 0 <= rank < world_size:
            raise ValueError(f"init_rpc needs 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        try:
            RpcAgent(name, rank, world_size, store, options, on_start=lambda a: _init_rpc_states(a, rref_class))
        except BaseException:
            set_current_rpc_agent(None)
            container.init(None)
            raise


def shutdown(graceful: bool = True, timeout: float = 0) -> None:
    """Stop RPC here; with ``graceful``, first wait until no worker has work outstanding (every worker must
    call it). ``timeout`` (seconds; 0: the agent's ``rpc_timeout``) bounds that wait."""
    global _owned_store
    agent = get_current_rpc_agent()
    try:
        if graceful:
            rpc_join.graceful(agent, timeout or agent.options.rpc_timeout or 300.0)
    finally:
        agent.close()
        with _lock:
            set_current_rpc_agent(None)
            container.init(None)
            store, _owned_store = _owned_store, None
        if store is not None and hasattr(store, "close"):
            store.close()


def _to_rank(to) -> int:
    """The rank of ``to`` (a name, an id or a ``WorkerInfo``); RuntimeError for none, as torch's agent;
    ValueError for another type (a float rank), as torch's ``_to_worker_info``."""
    agent = get_current_rpc_agent()
    if isinstance(to, WorkerInfo):
        to = to.id
    if isinstance(to, int):
        if not 0 <= to < agent.world_size:
            raise RuntimeError(f"Invalid destination worker id {to}: could not find destination "
                               f"(world size {agent.world_size})")
        return to
    if not isinstance(to, str):
        raise ValueError(f"Cannot get WorkerInfo from name {to}")
    for w in agent.workers:
        if w.name == to:
            return w.id
    raise RuntimeError(f"name:{to} could not find destination: unknown worker name")


def rpc_async(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """Run ``func(*args, **kwargs)`` on worker ``to`` (name, id or ``WorkerInfo``); a Future of its result.
    ``timeout`` in seconds (unset: the agent's ``rpc_timeout``; 0: none)."""
    return get_current_rpc_agent().request(_to_rank(to), ("call", func, tuple(args or ()), dict(kwargs or {})),
                                           timeout, container.current_context())


def rpc_sync(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """``rpc_async(...).wait()``: the result, or the remote exception re-raised here."""
    return rpc_async(to, func, args, kwargs, timeout).wait()


def remote(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """Run ``func`` on ``to`` and keep the result there; returns a user ``RRef`` to it at once."""
    return get_current_rpc_agent().rrefs.remote(_to_rank(to), func, tuple(args or ()), dict(kwargs or {}), timeout,
                                                container.current_context())
