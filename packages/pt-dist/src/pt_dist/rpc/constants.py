"""``torch.distributed.rpc.constants``: the RPC defaults, under the module path torch's tests import them from."""

from pt_dist.rpc.options import (
    DEFAULT_INIT_METHOD,
    DEFAULT_NUM_WORKER_THREADS,
    DEFAULT_RPC_TIMEOUT_SEC,
    UNSET_RPC_TIMEOUT,
)

__all__ = ["DEFAULT_INIT_METHOD", "DEFAULT_NUM_WORKER_THREADS", "DEFAULT_RPC_TIMEOUT_SEC", "UNSET_RPC_TIMEOUT"]
