"""Supervision of the executor's worker processes (vLLM ``MultiprocExecutor``'s death watch and shutdown).

Workers are spawned (a fresh interpreter: no forked CUDA or thread state) as daemons, so they die with a driver
that exits; each also watches its parent and exits when the driver vanishes without exiting cleanly (a SIGKILL),
instead of waiting forever for the next step. ``check`` turns a dead worker into ``WorkerDiedError`` naming its
rank, pid and exit code; ``stop`` joins them, then terminates and finally kills what is left, so no process
outlives the engine.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker process exited while the engine was running."""


def get_open_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)  # the driver is gone: nobody will ever send the next step


def _run(target: Callable, parent_pid: int, args: tuple) -> None:
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="parent-watch").start()
    target(*args)


class WorkerProcs:
    """Ranks 1..N-1, each running ``target(*args)`` in a spawned daemon process."""

    def __init__(self, target: Callable, args_per_rank: list[tuple]):
        ctx = multiprocessing.get_context("spawn")
        self.procs = [
            ctx.Process(target=_run, args=(target, os.getpid(), args), daemon=True, name=f"paged-serve-worker-{r}")
            for r, args in enumerate(args_per_rank, start=1)
        ]
        for proc in self.procs:
            proc.start()

    def check(self, wait: float = 0.0) -> None:
        """Raise ``WorkerDiedError`` for the first worker that has exited (``wait``: give each that long to exit,
        for a worker whose connection already dropped)."""
        for rank, proc in enumerate(self.procs, start=1):
            proc.join(wait)
            if proc.exitcode is not None:
                raise WorkerDiedError(f"tensor-parallel worker rank {rank} (pid {proc.pid}) died with exit code "
                                      f"{proc.exitcode}")  # fmt: skip

    def stop(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                logger.warning("%s (pid %d) did not exit in %.0f s: terminating it", proc.name, proc.pid, timeout)
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
