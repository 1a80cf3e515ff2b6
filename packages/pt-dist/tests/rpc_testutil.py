"""Start and stop pt_dist.rpc on harness ranks (imported by path, as ptdist_testutil); ``start_side`` starts
either pt_dist's RPC or torch's own (TensorPipe), so a test can run the same scenario on both."""

from __future__ import annotations

import time

import pt_dist.rpc as rpc
from pt_dist._infra.store import TCPStore

import harness

SIDES = ("pt_dist", "torch")


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


def side_modules(side: str):
    """``(rpc, dist_autograd)`` of ``side``: pt_dist's, or torch.distributed's."""
    if side == "torch":
        import torch.distributed.autograd as theirs_autograd
        import torch.distributed.rpc as theirs

        return theirs, theirs_autograd
    if side != "pt_dist":
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    import pt_dist.autograd as dist_autograd

    return rpc, dist_autograd


def start_side(side: str, rank: int, world_size: int, timeout: float = 60.0, **options):
    """init_rpc of ``side`` as ``worker{rank}``; returns its ``stop(graceful=True)``. torch's TensorPipe agent
    rendezvous on a free port rank 0 publishes through the harness store. ``timeout`` is the RPC timeout and
    (torch) the store's, which bounds how long its shutdown waits for a worker still busy: TensorPipe's reactor
    spins a core, so on 2 cores a busy worker is slow. Run torch's side in fresh processes
    (``run_ranks(..., fresh=True)``): a TensorPipe agent started again in a process that ran one before can hang
    in its shutdown (seen after an RRef whose creation timed out)."""
    if side == "pt_dist":
        store = start(rank, world_size, timeout, **options)
        return lambda graceful=True: stop(store, graceful)
    import ptdist_testutil

    theirs, _ = side_modules(side)
    if rank == 0:
        harness.store().set("torch_rpc_port", str(ptdist_testutil.free_port()))
    port = int(harness.store().get("torch_rpc_port"))
    opts = theirs.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=timeout, **options)
    theirs.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=opts)
    return lambda graceful=True: theirs.shutdown(graceful=graceful)


def raises(fn, *args, **kwargs) -> tuple[str, str] | None:
    """``(name of the built-in type, message)`` of what ``fn`` raised (a subclass of RuntimeError reads
    ``RuntimeError``), None if it returned."""
    try:
        fn(*args, **kwargs)
    except Exception as e:
        return next(c for c in type(e).__mro__ if c.__module__ == "builtins").__name__, str(e)
    return None
