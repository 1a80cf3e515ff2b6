"""torch's ``init_rpc(name, backend, rank, world_size, rpc_backend_options)`` over pt_dist/rpc/worker.py's:
``backend`` is accepted for the signature (there is one agent), and the RRefs the agent makes are torch's RRef
surface (rref.py), so ``rref.rpc_sync().method()`` works on every RRef a user receives."""

from __future__ import annotations

from pt_dist._compat.rpc.rref import RRef
from pt_dist.rpc import worker
from pt_dist.rpc.options import TensorPipeRpcBackendOptions


def init_rpc(name: str, backend=None, rank: int = -1, world_size: int | None = None,
             rpc_backend_options: TensorPipeRpcBackendOptions | None = None) -> None:
    """Start this worker's agent and connect to every other worker (torch's ``init_rpc``)."""
    worker.init_rpc(name, rank, world_size, rpc_backend_options, rref_class=RRef)
