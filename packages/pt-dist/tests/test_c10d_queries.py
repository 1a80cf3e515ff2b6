"""torch.distributed's small queries and settings, answered as torch answers them: ``group.WORLD``,
``get_pg_count``, ``get_backend_config``, ``is_backend_available``, ``is_torchelastic_launched``,
``supports_complex``, ``get_default_backend_for_device``; one store serving init after init;
``set_timeout`` (a later operation fails at the new timeout) on tcp, shm and the gloo adapter; and the error
kinds (``DistBackendError`` for a collective, ``DistNetworkError`` for a connection, ``DistStoreError`` for a
store wait), each a ``DistError``."""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed as dist
from pt_dist import DistBackendError, DistError, DistNetworkError, DistStoreError, GroupMember, ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def test_queries_answer_as_torch_does(monkeypatch):
    assert pt_dist.group.WORLD is None and pt_dist.get_pg_count() == 0
    pt_dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{util.free_port()}", rank=0, world_size=1,
                               timeout=5)
    try:
        assert pt_dist.group.WORLD is GroupMember.WORLD is not None
        assert pt_dist.get_pg_count() == 1 and pt_dist.get_backend_config() == "cpu:tcp"
        sub = pt_dist.new_group([0])
        assert pt_dist.get_pg_count() == 2 and pt_dist.get_backend_config(sub) == "cpu:tcp"
        for bad in (0, -1, datetime.timedelta(0), None):
            with pytest.raises(ValueError, match="set_timeout: timeout must be positive"):
                pt_dist.set_timeout(bad)
        with pytest.raises(ValueError, match="not a member"):
            pt_dist.set_timeout(5, group=GroupMember.NON_GROUP_MEMBER)
        pt_dist.set_timeout(datetime.timedelta(seconds=7))
        t = torch.ones(2)
        pt_dist.all_reduce(t)  # the setting is queued behind earlier operations and applies from here on
        assert GroupMember.WORLD.timeout == 7.0 and sub.timeout == 5.0
    finally:
        pt_dist.destroy_process_group()
    assert pt_dist.group.WORLD is None and pt_dist.get_pg_count() == 0
    assert pt_dist.is_backend_available("tcp") and pt_dist.is_backend_available("SHM")
    assert pt_dist.is_backend_available("gloo") == dist.is_gloo_available()
    assert pt_dist.is_backend_available("nccl") == (dist.is_nccl_available() and torch.cuda.is_available())
    assert not pt_dist.is_backend_available("no-such-backend")
    assert pt_dist.is_nccl_available is dist.is_nccl_available  # what torch was built with
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not pt_dist.is_torchelastic_launched()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-1")
    assert pt_dist.is_torchelastic_launched() == dist.is_torchelastic_launched() is True
    for op in ("SUM", "AVG", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert pt_dist.supports_complex(ReduceOp[op]) == dist.supports_complex(getattr(dist.ReduceOp, op)), op
    assert pt_dist.supports_complex(ReduceOp.PRODUCT)  # ours multiplies complex numbers; torch's says False
    assert pt_dist.get_default_backend_for_device("cpu") == "tcp"
    assert pt_dist.get_default_backend_for_device(torch.device("cuda", 1)) == "nccl"
    with pytest.raises(ValueError, match="no default backend for device 'meta'"):
        pt_dist.get_default_backend_for_device("meta")


def _shortened(rank, ws, backend):
    import harness

    util.join(rank, ws, backend, key=f"settimeout-{backend}", timeout=30)
    hs = harness.store()
    try:
        pt_dist.set_timeout(datetime.timedelta(seconds=1.5))
        if rank == 1:  # never joins the collective; leaves once rank 0 has given up
            hs.get(f"settimeout-{backend}-done")
            return None
        p2p_s = None
        if backend != "gloo":  # a gloo receive that times out breaks the pair: the all-reduce would fail at once
            t0 = time.monotonic()
            with pytest.raises(DistBackendError):  # point-to-point too: nothing is sent for this receive
                pt_dist.recv(torch.empty(3), src=1, tag=5)
            p2p_s = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            pt_dist.all_reduce(torch.ones(10))
        except DistBackendError as e:
            return str(e), time.monotonic() - t0, p2p_s
        finally:
            hs.set(f"settimeout-{backend}-done", "1")
        return None, time.monotonic() - t0, p2p_s
    finally:
        pt_dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_set_timeout_holds_for_the_next_collective(backend):
    (msg, elapsed, p2p_s), _ = run_ranks(_shortened, 2, backend, backend=None, timeout=90)
    assert msg is not None and "all_reduce" in msg, msg
    assert 1.0 < elapsed < 10, f"failed after {elapsed:.1f}s: the group was made with 30s, set to 1.5s"
    assert backend == "gloo" or 1.0 < p2p_s < 10, f"the receive failed after {p2p_s:.1f}s, not at 1.5s"


def test_error_kinds_are_torchs():
    assert all(issubclass(k, DistError) and issubclass(k, RuntimeError)
               for k in (DistBackendError, DistNetworkError, DistStoreError))
    assert not issubclass(DistNetworkError, DistStoreError)  # a refused connection is not a store timeout


def _cycles(rank, ws, backend):
    import harness

    if rank == 0:
        store = pt_dist.TCPStore("127.0.0.1", 0, ws, is_master=True, wait_for_workers=False, timeout=20)
        harness.store().set(f"cycles-{backend}", str(store.port))
    else:
        store = pt_dist.TCPStore("127.0.0.1", int(harness.store().get(f"cycles-{backend}")), ws, timeout=20)
    sums = []
    for cycle in range(3):  # torch's own serves this: init, destroy, init again on the caller's store
        pt_dist.init_process_group(backend, store=store, rank=rank, world_size=ws, timeout=20)
        t = torch.full((2,), float(cycle + 1))
        pt_dist.all_reduce(t)
        sums.append(t[0].item())
        pt_dist.destroy_process_group()
    store.set(f"after/{rank}", "ok")  # still the caller's, still open
    other = store.get(f"after/{1 - rank}")
    if rank == 1:  # its last call on the store is done: rank 0, whose process serves it, may leave now
        harness.store().set(f"cycles-{backend}-read", "1")
    else:
        harness.store().get(f"cycles-{backend}-read")
    return sums, other


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_one_store_serves_init_after_init(backend):
    """destroy_process_group used to close the caller's store (the next init could not connect), and a second init
    on it would have read the first one's keys (mesh addresses, secret, segment paths)."""
    for sums, other in run_ranks(_cycles, 2, backend, backend=None, timeout=90):
        assert sums == [2.0, 4.0, 6.0] and other == b"ok"
