"""``torch.distributed.rpc.api``'s names: the calls (worker.py), ``init_rpc`` with torch's signature and the agent
queries (pt_dist/_compat/rpc/)."""

from pt_dist._compat.rpc.agent_queries import (
    _rref_context_get_debug_info,
    _set_rpc_timeout,
    get_rpc_timeout,
    get_worker_info,
)
from pt_dist._compat.rpc.init_rpc import init_rpc
from pt_dist.rpc.rpc_agent import get_current_rpc_agent
from pt_dist.rpc.worker import remote, rpc_async, rpc_sync, shutdown

_get_current_rpc_agent = get_current_rpc_agent

__all__ = [
    "_get_current_rpc_agent", "_rref_context_get_debug_info", "_set_rpc_timeout", "get_rpc_timeout",
    "get_worker_info", "init_rpc", "remote", "rpc_async", "rpc_sync", "shutdown",
]
