"""The RPC agent's options and a worker's identity: torch's ``TensorPipeRpcBackendOptions`` and ``WorkerInfo``.

torch/distributed/rpc/options.py (``TensorPipeRpcBackendOptions``) and torch/csrc/distributed/rpc/types.h
(``WorkerInfo``). Timeouts are in seconds as torch's; ``0`` means no timeout. ``host`` is where this worker's
listener binds (loopback unless set: the agent runs any function an authenticated peer names), ``max_meta_bytes``
bounds a message's pickled part and ``max_message_bytes`` its tensors, so an oversized frame is refused before
anything is allocated for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

DEFAULT_RPC_TIMEOUT_SEC = 60.0
DEFAULT_INIT_METHOD = "env://"
DEFAULT_NUM_WORKER_THREADS = 16
UNSET_RPC_TIMEOUT = -1.0


@dataclass(frozen=True)
class WorkerInfo:
    """A worker's globally unique ``name`` and ``id`` (its rank), as torch's ``WorkerInfo``."""

    name: str
    id: int

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, name={self.name})"


@dataclass
class TensorPipeRpcBackendOptions:
    """Options of ``init_rpc``: torch's ``TensorPipeRpcBackendOptions`` fields plus the transport's limits.

    ``store``: an existing pt_dist store to rendezvous on instead of ``init_method`` (our addition, as
    ``init_process_group(store=...)``). ``device_maps``/``devices`` are not supported: tensors travel from CPU."""

    num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT_SEC
    init_method: str = DEFAULT_INIT_METHOD
    host: str = field(default_factory=lambda: os.environ.get("PT_DIST_RPC_HOST", "127.0.0.1"))
    store: object = None
    max_meta_bytes: int = 256 << 20
    max_message_bytes: int = 1 << 40
    chunk_bytes: int = 4 << 20

    def __post_init__(self):
        if self.num_worker_threads < 1:
            raise ValueError(f"num_worker_threads must be >= 1, got {self.num_worker_threads}")
        if self.rpc_timeout < 0:
            raise ValueError(f"rpc_timeout must be >= 0 seconds, got {self.rpc_timeout}")
