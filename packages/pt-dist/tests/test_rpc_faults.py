"""Dead workers and shutdown: a call to a worker that died fails fast and clearly; shutdown never hangs.

Ported in spirit from torch/testing/_internal/distributed/rpc/faulty_agent_rpc_test.py and rpc_test.py's
test_wait_all_workers / test_shutdown tests: the dying worker is a process rank 0 forks (so the harness sees no
rank die), which exits mid-call, or in the middle of its own graceful shutdown.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pt_dist.rpc as rpc
import pytest
import torch
from pt_dist._infra import rpc_join as join
from pt_dist._infra.store import TCPStore
from pt_dist.rpc.rpc_agent import is_current_rpc_agent_set

import harness
from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import rpc_testutil as util  # noqa: E402


def die():
    os._exit(0)


def _child(port: int, when: str) -> None:
    try:
        torch.set_num_threads(1)
        store = TCPStore("127.0.0.1", port, timeout=20)
        opts = rpc.TensorPipeRpcBackendOptions(store=store, rpc_timeout=20)
        rpc.init_rpc("worker1", rank=1, world_size=2, rpc_backend_options=opts)
        if when == "in shutdown":
            real, calls = join._barrier, []

            def dying(*args):
                calls.append(1)
                if len(calls) == 2:  # past the entry barrier: in the join rounds
                    os._exit(0)
                return real(*args)

            join._barrier = dying
        rpc.shutdown()
    finally:
        os._exit(0)


def _dead_peer(rank, world_size, when):
    store = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=20)
    child = os.fork()
    if child == 0:
        _child(store.port, when)
    out = {}
    rpc.init_rpc("worker0", rank=0, world_size=2,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(store=store, rpc_timeout=10))
    try:
        out["ok"] = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(1), 1)).item()
        if when == "mid call":
            t0 = time.monotonic()
            try:
                rpc.rpc_sync("worker1", die)
            except RuntimeError as e:
                out["error"], out["elapsed"] = str(e), time.monotonic() - t0
            t0 = time.monotonic()
            try:
                rpc.rpc_sync("worker1", torch.add, args=(torch.ones(1), 1))
            except RuntimeError as e:
                out["again"], out["again_elapsed"] = str(e), time.monotonic() - t0
        t0 = time.monotonic()
        try:
            rpc.shutdown(timeout=2)
        except RuntimeError as e:
            out["shutdown"] = str(e)
        out["shutdown_elapsed"] = time.monotonic() - t0
    finally:
        if is_current_rpc_agent_set():
            rpc.shutdown(graceful=False)
        os.waitpid(child, 0)
        store.close()
    return out


@pytest.mark.parametrize("when", ["mid call", "in shutdown"])
def test_a_dead_worker_fails_calls_and_shutdown_within_the_timeout(when):
    out = run_ranks(_dead_peer, 1, when, backend=None, timeout=60)[0]
    assert out["ok"] == 2.0
    if when == "mid call":
        assert "worker1" in out["error"] and "gone" in out["error"], out["error"]
        assert out["elapsed"] < 5, f"{out['elapsed']:.1f}s: death must be noticed from the socket, not the timeout"
        assert "worker1" in out["again"] and out["again_elapsed"] < 1
    assert "shutdown" in out.get("shutdown", ""), out
    assert out["shutdown_elapsed"] < 6, out["shutdown_elapsed"]  # the shutdown timeout is 2 s


def _healthy_shutdown(rank, world_size):
    store = util.start(rank, world_size)
    futs = [rpc.rpc_async(f"worker{(rank + 1) % world_size}", time.sleep, args=(0.3,)) for _ in range(3)]
    harness.store().set(f"sent{rank}", "1")
    t0 = time.monotonic()
    util.stop(store)  # graceful: waits for the sleeps everyone started
    done = all(f.done() for f in futs)
    return done, time.monotonic() - t0


def test_graceful_shutdown_waits_for_outstanding_work_and_does_not_hang():
    for done, elapsed in run_ranks(_healthy_shutdown, 3, backend=None, timeout=60):
        assert done
        assert 0.25 < elapsed < 5, elapsed
