"""``torch.distributed.rpc`` rebuilt: run functions on other workers, RRefs, futures; see docs/rpc.md.

Read in this order: ``worker.py`` (init_rpc, the calls, shutdown), ``agent.py`` (requests, responses, timeouts),
``serialize.py`` (pickle without tensors), ``handlers.py`` (what the callee runs), ``rref.py`` and
``rref_context.py`` (the RRef protocol). The sockets, threads and shutdown's termination detection under them are
``pt_dist/_infra/rpc_*.py``; torch's surface over them (``init_rpc``'s signature, the RRef proxies,
``async_execution``, the agent queries) is ``pt_dist/_compat/rpc/``.
"""

from torch.futures import Future, collect_all, wait_all

from pt_dist._compat.rpc.agent_queries import (
    _rref_context_get_debug_info,
    _set_rpc_timeout,
    get_rpc_timeout,
    get_worker_info,
)
from pt_dist._compat.rpc.init_rpc import init_rpc
from pt_dist._compat.rpc.rref import RRef
from pt_dist.rpc import api, constants, functions
from pt_dist.rpc.options import DEFAULT_RPC_TIMEOUT_SEC, TensorPipeRpcBackendOptions, WorkerInfo
from pt_dist.rpc.worker import remote, rpc_async, rpc_sync, shutdown

RpcBackendOptions = TensorPipeRpcBackendOptions  # torch's base class; one options class here

__all__ = [
    "DEFAULT_RPC_TIMEOUT_SEC", "Future", "RRef", "RpcBackendOptions", "TensorPipeRpcBackendOptions", "WorkerInfo",
    "_rref_context_get_debug_info", "_set_rpc_timeout", "api", "collect_all", "constants", "functions",
    "get_rpc_timeout", "get_worker_info", "init_rpc", "remote", "rpc_async", "rpc_sync", "shutdown", "wait_all",
]
