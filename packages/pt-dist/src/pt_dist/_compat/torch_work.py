"""The Work of an adapter collective: torch's own Work, plus the adapter's post step (AVG's division, a copy-back).

torch's ``Work`` (c10d's ``Work.hpp``; gloo's ``AsyncWork``, NCCL's ``WorkNCCL``) with one thing added: the
adapter's ``post`` runs exactly once, after torch's part, before anyone sees the result, and a Work is complete
only once it has.
"""

from __future__ import annotations

import datetime
import threading

import torch

from pt_dist._infra.errors import DistBackendError, DistError
from pt_dist.work import Work


class TorchWork(Work):
    """Wraps a torch Work; ``post`` (copy-back, AVG division) runs exactly once after completion.

    On GPUs torch's Work orders streams rather than blocking: NCCL marks its future complete at launch, and each
    ``wait()`` makes the caller's current stream wait for the kernel. So every ``wait()`` here calls torch's,
    and, where ``get_future()`` ran the post step in a callback (on a stream from torch's pool), also waits on
    that CUDA-aware future, which orders the current stream after the post's copies. Only with ``streams``
    (NCCL's groups): gloo's point-to-point Work waits for another transfer when waited on twice.
    """

    def __init__(self, op_name: str, group_name: str, twork, result, post=None, streams: bool = False):
        super().__init__(op_name)
        self._streams = streams
        self._twork, self._result, self._post, self._group = twork, result, post, group_name
        self._post_lock = threading.RLock()  # (get_future chains under it; a done future runs the post at once)
        self._claimed = False  # by the one waiter that finishes the Work
        self._chained: torch.futures.Future | None = None  # torch's future with the post step, once asked for

    def _run_post(self):
        with self._post_lock:
            if self._post is not None:
                post, self._post = self._post, None
                with torch.inference_mode():  # copy-backs and AVG on inference tensors, as c10d's own writes
                    post()
        return self._result

    def wait(self, timeout=None):
        """Several threads may wait at once (a watchdog polling ``is_completed`` while the caller waits): one of
        them finishes the Work. A ``timeout`` that runs out leaves it pending, as torch's (a later wait succeeds)."""
        if self._done.is_set():
            super().wait()
            return self._order_streams(again=True)
        result, exc = None, None
        try:
            if self._twork is not None:
                self._twork.wait() if timeout is None else self._twork.wait(
                    timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(seconds=timeout))
            result = self._run_post()
        except DistError as e:
            exc = e
        except RuntimeError as e:
            exc = DistBackendError(f"{self.op_name} on group {self._group!r} failed in torch.distributed: {e}")
            ran_out = timeout is not None and self._twork is not None and not self._twork.is_completed()
            if ran_out:  # only this wait ran out
                raise DistBackendError(f"{self.op_name} on group {self._group!r}: Work.wait timed out after "
                                       f"{timeout}") from e
        with self._post_lock:
            claimed, self._claimed = not self._claimed, True
        if claimed:
            self._finish(result, exc)
        super().wait(timeout)
        return self._order_streams(again=not claimed)

    def _order_streams(self, again: bool) -> bool:
        if self._streams and self._twork is not None:
            if again:  # (the waiter that finished the Work has just waited on torch's)
                self._twork.wait()
            if self._chained is not None:
                self._chained.wait()
        return True

    def is_completed(self):  # done only once the post step (AVG's division, a copy-back) is, as torch's own work
        if self._done.is_set() or self._twork is None:
            return True
        if not self._twork.is_completed():
            return False
        try:  # torch's part is over: run the post step now, without blocking (a failure waits for wait())
            self.wait()
        except Exception:  # noqa: BLE001
            pass
        return True

    def _source_rank(self) -> int:
        self.wait()
        return self._source if self._source is not None else self._twork._source_rank()  # any source: torch's

    def get_future(self):
        """torch's own future (CUDA-aware on GPUs) chained with the post step; the same one on every call."""
        if self._twork is None:
            return super().get_future()
        with self._post_lock:
            if self._chained is None:
                try:
                    future = self._twork.get_future()
                except RuntimeError:  # some of torch's Works have none (gloo's reduce_scatter_tensor): ours, which
                    self._blocker = lambda work, timeout=None: self.wait(timeout)  # the first wait finishes
                    return super().get_future()
                self._chained = future.then(lambda fut: (fut.wait(), self._run_post())[1])
            return self._chained
