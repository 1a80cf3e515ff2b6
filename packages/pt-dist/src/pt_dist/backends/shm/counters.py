"""How the shm backend's ranks wait for each other: monotonically increasing per-rank counters in the shared
segment, one per cache line (no false sharing between spinning ranks).

A barrier bumps this rank's counter and waits until every peer's has reached the same value: spinning first
(barrier skew between ranks is tens to hundreds of microseconds, about what a futex sleep and wake cost, so
spinning through it keeps small messages fast; the spinner yields its core between polls, so that any other
runnable thread on the host takes the spinner's core rather than preempting the peer being waited for; a
collective running on the group's thread, async, does not spin), then sleeping in ``FUTEX_WAIT`` on the late
peer's counter (``futex.py``). A sleeper checks every 5 ms
the abort word (control word 0: rank+1 of a rank that gave up), whether this rank is shutting the group down
(from another thread), whether the ranks it waits for are still alive and still in the group (a rank's
shutdown clears its pid word), and the timeout, so a failure anywhere becomes a ``DistBackendError`` in
milliseconds.
"""

from __future__ import annotations

import os
import time

from pt_dist._infra.errors import DistBackendError, missing_text
from pt_dist._infra.futex import pid_dead
from pt_dist.work import on_group_thread

LINE = 64
SPIN_S = float(os.environ.get("PT_DIST_SHM_SPIN_US", 2000)) / 1e6  # spin this long before sleeping on a futex
ABORT = 0


class CounterBarrier:
    """The shm group's barrier over its control words: ``ctl`` (int64 view: word 0 the abort word, word
    ``(1 + j) * 8`` rank j's counter, word ``(1 + size + j) * 8`` its pid) at address ``base``; ``pg`` is the group
    (rank, size, name and its current timeout)."""

    def __init__(self, pg, ctl, base: int, futex):
        self.pg, self._ctl, self._base, self._futex = pg, ctl, base, futex
        self.epoch = 0  # barriers so far: every rank's counter reaches it together
        self.closing = False  # this rank is shutting the group down, from another thread

    def arrive_and_wait(self, op: str) -> None:
        """Bump our counter and wake its sleepers, then wait for every peer's."""
        self.epoch += 1
        target, ctl = self.epoch, self._ctl
        me = (1 + self.pg._rank) * 8
        ctl[me] = target
        self._futex.wake(self._base + me * 8)
        for j in range(self.pg._size):
            idx = (1 + j) * 8
            if ctl[idx] < target:
                self._wait_for(op, idx, target)

    def _wait_for(self, op: str, idx: int, target: int) -> None:
        ctl = self._ctl
        # an async collective (the group's thread) overlaps its caller's compute: spinning would hold the GIL that
        # thread needs between kernels (and its core), so it goes to the futex at once
        spin_end = time.monotonic() + (0.0 if on_group_thread() else SPIN_S)
        while True:
            for _ in range(64):
                if ctl[idx] >= target:
                    return
            # (a no-op when nothing else is runnable; with a third runnable task on the cores, not yielding
            # lets the scheduler preempt the peer instead, and every barrier then waits out its time slice)
            os.sched_yield()
            if time.monotonic() >= spin_end:
                break
        deadline = time.monotonic() + self.pg.timeout
        next_check = 0.0
        while True:
            seen = ctl[idx]
            if seen >= target:
                return
            now = time.monotonic()
            if now >= next_check:
                self.check_peers(op, target, now >= deadline)
                next_check = now + 0.005
            self._futex.wait(self._base + idx * 8, seen, 0.005)

    def check_peers(self, op: str, target: int | None = None, timed_out: bool = False) -> None:
        """Raise if a rank short of ``target`` (default: the next barrier) aborted, left, exited, or is late."""
        ctl, size, name = self._ctl, self.pg._size, self.pg.group_name
        target = self.epoch + 1 if target is None else target
        lagging = [j for j in range(size) if ctl[(1 + j) * 8] < target]
        if ctl[ABORT]:
            raise DistBackendError(f"{op} on shm group {name!r}: rank {ctl[ABORT] - 1} aborted the group "
                                   f"after a failure; {missing_text(lagging)}")
        if self.closing:
            raise DistBackendError(f"{op} on shm group {name!r}: the group was shut down (destroyed) "
                                   f"mid-collective; {missing_text(lagging)}")
        pids = {j: ctl[(1 + size + j) * LINE // 8] for j in lagging}
        left = [j for j, pid in pids.items() if pid == 0]  # a rank's shutdown clears its pid word
        if left:
            raise DistBackendError(f"{op} on shm group {name!r}: ranks {left} shut the group down "
                                   f"(destroy_process_group); {missing_text(left)}")
        dead = [j for j, pid in pids.items() if pid_dead(pid)]
        if dead:
            raise DistBackendError(f"{op} on shm group {name!r}: ranks {dead} exited; {missing_text(dead)}")
        if timed_out:
            raise DistBackendError(f"{op} on shm group {name!r} timed out after {self.pg.timeout:.1f}s; "
                                   f"{missing_text(lagging)}")

    def aborted(self) -> bool:
        return bool(self._ctl[ABORT])

    def abort(self) -> None:
        """Raise the abort word (rank+1 of the first rank to give up) and wake every sleeper to see it."""
        if not self._ctl[ABORT]:
            self._ctl[ABORT] = self.pg._rank + 1
        self.wake_sleepers()

    def leave(self) -> None:
        """This rank is shutting the group down: its waits raise now, and so do peers waiting for it."""
        self.closing = True
        self._ctl[(1 + self.pg._size + self.pg._rank) * LINE // 8] = 0
        self.wake_sleepers()

    def wake_sleepers(self) -> None:
        for j in range(self.pg._size):  # sleepers on any counter re-check the abort word (and our flag) at once
            self._futex.wake(self._base + (1 + j) * LINE)
