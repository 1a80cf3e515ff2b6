"""``monitored_barrier``: a barrier that names the ranks that did not reach it (torch's, gloo's monitoredBarrier).

A debugging aid for hangs: put one before the collective that never returns, and instead of every rank
waiting silently, group rank 0 reports who is missing. Each rank checks in under a per-call key of the
job's store; rank 0 waits for the others until ``timeout`` and posts the verdict, which the others wait
for, so every rank that arrived raises the same ``DistError``. It goes through the store, not the
group's transport, so it works on every backend, and a rank that is alive but stuck elsewhere (not
dead, so no transport sees it fail) is still named. When all arrived, rank 0 returns only once the others
have read the verdict (so a ``destroy_process_group`` right after cannot close the store under them) and
then deletes the call's keys (so a barrier every step does not grow the store).
"""

from __future__ import annotations

import time
import weakref

from pt_dist import distributed_c10d as c10d
from pt_dist._infra.errors import DistBackendError
from pt_dist._infra.store import PrefixStore

__all__ = ["monitored_barrier"]

_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per live group: calls so far, alike on its ranks
_POLL_S = 0.005


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """Wait until every rank of ``group`` arrives; raise ``DistError`` naming the ranks (global) that did not within
    ``timeout`` (seconds or timedelta; default: the group's). ``wait_all_ranks``: name all of them, not the first."""
    if c10d._rank_not_in_group(group, "monitored_barrier"):
        return
    pg = c10d._group(group)
    t = c10d._seconds(timeout)
    if t <= 0:
        raise ValueError(f"monitored_barrier: timeout must be positive, got {timeout!r}")
    n = _calls[pg] = _calls.get(pg, 0) + 1
    store = PrefixStore(f"pt_dist/monitored_barrier/{pg.group_name}/{n}", c10d._world.store)
    ranks, me = c10d.get_process_group_ranks(pg), pg.rank()
    store.set(f"arrived/{me}", b"1")
    if me == 0:
        pending = list(range(1, pg.size()))
        deadline = time.monotonic() + t
        while pending and time.monotonic() < deadline:
            pending = [r for r in pending if not store.check([f"arrived/{r}"])]
            if pending:
                time.sleep(_POLL_S)
        late = [ranks[r] for r in (pending if wait_all_ranks else pending[:1])]
        store.set("verdict", ",".join(map(str, late)).encode())
        if not late:
            _clear(store, pg.size(), time.monotonic() + min(t, 10.0))
    else:
        deadline = time.monotonic() + t + min(t, 10.0)  # rank 0 may take all of ``timeout`` to decide
        while not store.check(["verdict"]):
            if time.monotonic() > deadline:
                raise DistBackendError(f"monitored_barrier on group {pg.group_name!r}: rank {ranks[0]} (the group's "
                                       f"rank 0, which checks the others in) did not report within {t:.1f}s")
            time.sleep(_POLL_S)
        late = [int(r) for r in store.get("verdict").decode().split(",") if r]
        store.add("read", 1)
    if late:
        more = "" if wait_all_ranks else " (the first found; pass wait_all_ranks=True for all)"
        raise DistBackendError(f"monitored_barrier on group {pg.group_name!r}: rank(s) {late}{more} did not reach it "
                               f"within {t:.1f}s")


def _clear(store, size: int, deadline: float) -> None:
    """Rank 0, after a barrier all reached: wait until the others have read the verdict, then delete the keys."""
    while store.add("read", 0) < size - 1 and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for key in [f"arrived/{r}" for r in range(size)] + ["verdict", "read"]:
        store.delete_key(key)
