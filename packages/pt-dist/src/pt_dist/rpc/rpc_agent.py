"""The process's current RPC agent: torch's ``RpcAgent::setCurrentRpcAgent`` / ``getCurrentRpcAgent`` (rpc_agent.h).

``init_rpc`` (worker.py) sets it before any peer can reach this worker, ``shutdown`` clears it; the calls and
an ``RRef(value)`` made here find the agent through it, so rref.py needs nothing of worker.py.
"""

from __future__ import annotations

_agent = None


def set_current_rpc_agent(agent) -> None:
    global _agent
    _agent = agent


def get_current_rpc_agent():
    if _agent is None:
        raise RuntimeError("RPC has not been initialized. Call pt_dist.rpc.init_rpc first.")
    return _agent


def is_current_rpc_agent_set() -> bool:
    return _agent is not None
