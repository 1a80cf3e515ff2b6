"""Start and stop pt_dist.rpc on harness ranks (imported by path, as ptdist_testutil)."""

from __future__ import annotations

import time

import pt_dist.rpc as rpc
from pt_dist.store import TCPStore

import harness


def start(rank: int, world_size: int, timeout: float = 20.0, key: str = "rpc_port", **options) -> TCPStore:
    """init_rpc as ``worker{rank}`` on a TCPStore rank 0 binds on port 0 (its port goes through the harness store)."""
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout)
        harness.store().set(key, str(store.port))
    else:
        store = TCPStore("127.0.0.1", int(harness.store().get(key)), world_size, is_master=False, timeout=timeout)
    opts = rpc.TensorPipeRpcBackendOptions(store=store, rpc_timeout=timeout, **options)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    return store


def stop(store: TCPStore, graceful: bool = True) -> None:
    rpc.shutdown(graceful=graceful)
    store.close()


def wait_for(pred, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``pred`` until true; fail naming ``what`` (RRef deletes and cleanups are asynchronous)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
