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
    """Mixin for ``ProcessGroupSHM``: needs ``_ctl`` (the control words as int64), ``_base`` (their address),
    ``_futex``, ``_epoch``, ``mesh`` and the group's rank, size, timeout and name."""

    _closing = False

    def _arrive_and_wait(self, op: str) -> None:
        """Barrier on the counters: bump ours and wake its sleepers, then wait for every peer's."""
        self._epoch += 1
        target, ctl = self._epoch, self._ctl
        me = (1 + self._rank) * 8
        ctl[me] = target
        self._futex.wake(self._base + me * 8)
        for j in range(self._size):
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
        deadline = time.monotonic() + self.timeout
        next_check = 0.0
        while True:
            seen = ctl[idx]
            if seen >= target:
                return
            now = time.monotonic()
            if now >= next_check:
                self._check_peers(op, target, now >= deadline)
                next_check = now + 0.005
            self._futex.wait(self._base + idx * 8, seen, 0.005)

    def _check_peers(self, op: str, target: int, timed_out: bool) -> None:
        ctl = self._ctl
        lagging = [j for j in range(self._size) if ctl[(1 + j) * 8] < target]
        if ctl[ABORT]:
            raise DistBackendError(f"{op} on shm group {self.group_name!r}: rank {ctl[ABORT] - 1} aborted the group "
                                   f"after a failure; {missing_text(lagging)}")
        if self._closing:
            raise DistBackendError(f"{op} on shm group {self.group_name!r}: the group was shut down (destroyed) "
                                   f"mid-collective; {missing_text(lagging)}")
        pids = {j: ctl[(1 + self._size + j) * LINE // 8] for j in lagging}
        left = [j for j, pid in pids.items() if pid == 0]  # a rank's shutdown clears its pid word
        if left:
            raise DistBackendError(f"{op} on shm group {self.group_name!r}: ranks {left} shut the group down "
                                   f"(destroy_process_group); {missing_text(left)}")
        dead = [j for j, pid in pids.items() if pid_dead(pid)]
        if dead:
            raise DistBackendError(f"{op} on shm group {self.group_name!r}: ranks {dead} exited; {missing_text(dead)}")
        if timed_out:
            raise DistBackendError(f"{op} on shm group {self.group_name!r} timed out after {self.timeout:.1f}s; "
                                   f"{missing_text(lagging)}")

    def _abort(self) -> None:
        if not self._ctl[ABORT]:
            self._ctl[ABORT] = self._rank + 1
        self._wake_sleepers()
        self.mesh.close()

    def _wake_sleepers(self) -> None:
        for j in range(self._size):  # sleepers on any counter re-check the abort word (and our flag) at once
            self._futex.wake(self._base + (1 + j) * LINE)
