"""``torch.distributed.rpc`` rebuilt: run functions on other workers, RRefs, futures; see docs/rpc.md.

Read in this order: ``api.py`` (the calls), ``agent.py`` (requests, responses, timeouts), ``serialize.py``
(pickle without tensors), ``handlers.py`` (what the callee runs), ``rref.py`` and ``rref_context.py`` (the RRef
protocol), ``join.py`` (graceful shutdown). The sockets and threads under them are ``pt_dist/_infra/rpc_*.py``;
the agent queries (``get_worker_info``, timeouts, debug info) ``pt_dist/_compat/rpc/``.
"""

from torch.futures import Future, collect_all, wait_all

from pt_dist._compat.rpc.agent_queries import (
    _rref_context_get_debug_info,
    _set_rpc_timeout,
    get_rpc_timeout,
    get_worker_info,
)
from pt_dist.rpc import constants, functions
from pt_dist.rpc.api import init_rpc, remote, rpc_async, rpc_sync, shutdown
from pt_dist.rpc.options import (
    DEFAULT_RPC_TIMEOUT_SEC,
    RpcBackendOptions,
    TensorPipeRpcBackendOptions,
    WorkerInfo,
)
from pt_dist.rpc.rref import RRef

__all__ = [
    "DEFAULT_RPC_TIMEOUT_SEC", "Future", "RRef", "RpcBackendOptions", "TensorPipeRpcBackendOptions", "WorkerInfo",
    "_rref_context_get_debug_info", "_set_rpc_timeout", "collect_all", "constants", "functions", "get_rpc_timeout",
    "get_worker_info", "init_rpc", "remote",
    "rpc_async", "rpc_sync", "shutdown", "wait_all",
]
