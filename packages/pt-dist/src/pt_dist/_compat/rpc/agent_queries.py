"""torch.distributed.rpc's queries of the running agent: ``get_worker_info``, ``get_rpc_timeout`` /
``_set_rpc_timeout`` and ``_rref_context_get_debug_info`` (torch/distributed/rpc/api.py and the agent's
bindings in torch/csrc/distributed/rpc/init.cpp). Functions over the core's agent and RRef context.
"""

from __future__ import annotations

from pt_dist.rpc.options import WorkerInfo
from pt_dist.rpc.rpc_agent import get_current_rpc_agent
from pt_dist.rpc.worker import _to_rank


def get_worker_info(worker_name: str | None = None) -> WorkerInfo:
    """This worker's ``WorkerInfo``, or the one named ``worker_name``."""
    agent = get_current_rpc_agent()
    return agent.info if worker_name is None else agent.workers[_to_rank(worker_name)]


def get_rpc_timeout() -> float:
    """The default timeout of RPCs started from now on, in seconds (torch's ``get_rpc_timeout``)."""
    return float(get_current_rpc_agent().options.rpc_timeout)


def _set_rpc_timeout(rpc_timeout: float) -> None:
    """Set the default timeout (seconds; 0: none) of RPCs started from now on (torch's ``_set_rpc_timeout``);
    calls already in flight keep theirs."""
    if rpc_timeout < 0:
        raise ValueError(f"rpc_timeout must be >= 0 seconds, got {rpc_timeout}")
    get_current_rpc_agent().options.rpc_timeout = float(rpc_timeout)


def _rref_context_get_debug_info() -> dict[str, int]:
    """The owner-side counts (torch's ``_rref_context_get_debug_info``): ``num_owner_rrefs``, ``num_forks``,
    ``num_pending_users``, ``num_pending_children``."""
    rrefs = get_current_rpc_agent().rrefs
    with rrefs._lock:
        return {"num_owner_rrefs": len(rrefs.owners), "num_forks": sum(len(f) for f in rrefs.forks.values()),
                "num_pending_users": len(rrefs.pending_users), "num_pending_children": len(rrefs.pending_children)}
