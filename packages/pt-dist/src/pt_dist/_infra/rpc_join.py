"""Graceful shutdown's termination detection: torch's ``_wait_all_workers`` and ``TensorPipeAgent::join``, over
the store. ``shutdown(graceful=True)`` (pt_dist/rpc/worker.py) calls ``graceful(agent, timeout)`` before closing.

Every worker (1) reaches shutdown (a store barrier), (2) deletes its user RRefs (torch's
``_delete_all_user_and_unforked_owner_rrefs``), (3) waits until nothing is pending or being served here and
then enters a round: a barrier that also sums how many requests each worker has sent so far. Two rounds in a
row with the same sum, every worker idle on entering each, means no request is in flight anywhere (torch's
``syncCallCount`` compares sends and receives the same way). (4) Rank 0 may host the store, so it waits for
everyone to sign off before its agent (and the caller's store) goes. Each wait is bounded by one deadline: a
worker that died makes the others raise naming what did not finish, instead of hanging.
"""

from __future__ import annotations

import itertools
import time

from pt_dist._infra.errors import DistError


def _barrier(agent, key: str, deadline: float) -> None:
    store, n = agent.store, agent.world_size
    if store.add(key, 1) == n:
        store.set(f"{key}/done", "1")
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            gone = dict(agent.connections.gone) or "none"
            raise RuntimeError(f"rpc shutdown of {agent.info}: not every worker reached '{key}' before the timeout "
                               f"(connections gone: {gone}); a worker died or is stuck")
        try:
            store.wait([f"{key}/done"], min(left, 1.0))
            return
        except DistError:
            continue


def graceful(agent, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    _barrier(agent, "rpc/shutdown/enter", deadline)
    for f in agent.rrefs.delete_all_users():
        try:
            f.wait()
        except RuntimeError:
            pass
    previous = None
    for r in itertools.count():
        if not agent.wait_idle(deadline):
            raise RuntimeError(f"rpc shutdown of {agent.info}: requests still in flight at the timeout")
        agent.store.add(f"rpc/shutdown/round{r}/sent", agent.sent)
        _barrier(agent, f"rpc/shutdown/round{r}", deadline)
        total = agent.store.add(f"rpc/shutdown/round{r}/sent", 0)
        if total == previous:
            break
        previous = total
    agent.closing = True  # quiescent everywhere: peers closing now is the expected end, not a failure
    agent.store.add("rpc/shutdown/left", 1)
    if agent.rank == 0:
        while agent.store.add("rpc/shutdown/left", 0) < agent.world_size:
            if time.monotonic() > deadline:
                raise RuntimeError("rpc shutdown: not every worker signed off before the timeout")
            time.sleep(0.005)
