"""Run a function on N spawned ranks with torch.distributed initialised, and fail loudly.

The shape of torch's ``MultiProcessTestCase`` and DeepSpeed's ``DistributedTest``: ranks are
started from a fork server that imported torch (a process that never ran gloo: forking the test process itself
deadlocks with gloo), rendezvous through a TCPStore the parent binds on port 0
(no MASTER_PORT races under pytest-xdist), and the parent watches every rank so a raise,
a death or a hang fails the test with the rank named instead of hanging the run.

Importing torch costs seconds, so ranks live in a small pool that is reused between calls,
as DeepSpeed's test harness does; a failed call throws the pool away.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import queue
import signal
import time
from dataclasses import dataclass, field

from harness.worker import FnRef, stacks_path, worker_main

DEFAULT_TIMEOUT = float(os.environ.get("HARNESS_TIMEOUT", "120"))
STARTUP_TIMEOUT = 300.0
# After one rank fails, how long the others get to report (they are usually stuck in a collective).
GRACE_AFTER_FAILURE = 2.0


class RankError(AssertionError):
    """One or more ranks raised, died or did not finish in time."""


@dataclass
class _Pool:
    procs: list = field(default_factory=list)
    cmd_queues: list = field(default_factory=list)
    stacks: list = field(default_factory=list)  # per rank: the file it writes its threads' stacks to
    results: object = None

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.join(timeout=5)
        for path in self.stacks:
            with contextlib.suppress(OSError):
                os.unlink(path)
        for q in [*self.cmd_queues, self.results]:
            if q is not None:
                q.close()
                q.cancel_join_thread()


_pool: _Pool | None = None


_PRELOAD = ["torch", "torch.distributed", "harness.worker"]


def _context(env: dict | None):
    """Ranks come from a fork server that has imported torch once (no process group, no threads: safe to fork),
    so a new rank costs no import; ranks whose ``env`` must be set before anything is imported are spawned."""
    if env:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _spawn(world_size: int, env: dict | None) -> _Pool:
    ctx = _context(env)
    pool = _Pool(results=ctx.Queue())
    saved = dict(os.environ)
    try:
        if env:
            os.environ.update({k: str(v) for k, v in env.items()})
        for rank in range(world_size):
            cmd = ctx.Queue()
            pool.stacks.append(stacks_path(rank))
            # not daemonic, so a rank may start processes of its own (DataLoader workers), as torch's test ranks
            # may; the pool is killed at the session's end, or at exit (below)
            p = ctx.Process(target=worker_main, args=(rank, cmd, pool.results, pool.stacks[-1], os.getpid()))
            p.start()
            pool.procs.append(p)
            pool.cmd_queues.append(cmd)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _wait_ready(pool, world_size)
    return pool


def _wait_ready(pool: _Pool, world_size: int) -> None:
    """Ranks import torch before the job's clock starts; a rank that dies while starting fails here."""
    ready: set[int] = set()
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while len(ready) < world_size:
        try:
            rank, status, _ = pool.results.get(timeout=0.1)
            ready.add(rank)
        except queue.Empty:
            dead = [r for r, p in enumerate(pool.procs) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                pool.kill()
                raise RankError(f"ranks {dead or sorted(set(range(world_size)) - ready)} failed to start") from None


def _get_pool(world_size: int) -> _Pool:
    """The shared pool, grown (respawned) when a call needs more ranks than it has."""
    global _pool
    if _pool is not None and (len(_pool.procs) < world_size or not _pool.alive()):
        _pool.kill()
        _pool = None
    if _pool is None:
        _pool = _spawn(world_size, None)
    return _pool


def shutdown() -> None:
    """Kill the pooled ranks (called at the end of the pytest session, and at exit: multiprocessing would wait
    for them otherwise)."""
    global _pool
    if _pool is not None:
        _pool.kill()
        _pool = None


atexit.register(shutdown)


def resolve_backend(backend: str | None, world_size: int) -> str | None:
    if backend != "auto":
        return backend
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world_size else "gloo"


def run_ranks(fn, world_size: int, *args, backend: str | None = "auto", timeout: float | None = None,
              env: dict | None = None, fresh: bool = False) -> list:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return their results by rank.

    backend: "auto" (nccl when there are ``world_size`` CUDA devices, else gloo), "gloo", "nccl",
    or None to skip ``init_process_group`` (for code that brings its own process groups; the ranks
    still get RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR and ``harness.store()``).
    env: variables set in fresh rank processes before they import anything (implies ``fresh``).
    fresh: use new processes for this call instead of the reused pool.
    Pooled ranks start each call as a fresh one would: the parent's environment as of this call, the
    working directory, default dtype, grad mode and RNG states they started with, no default group.
    Raises ``RankError`` naming the ranks that raised (with their tracebacks), died or hung.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    ref = FnRef.of(fn)
    backend = resolve_backend(backend, world_size)
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                     timeout=datetime.timedelta(seconds=timeout))
    job = {"fn": ref, "args": pickle.dumps(args), "world_size": world_size, "backend": backend,
           "store_port": store.port, "timeout": timeout,
           "environ": {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}}
    pool = _spawn(world_size, env) if (fresh or env) else _get_pool(world_size)
    ok = False
    try:
        for rank in range(world_size):
            pool.cmd_queues[rank].put(job)
        results = _collect(pool, world_size, timeout)
        ok = True
        return results
    finally:
        if fresh or env or not ok:
            pool.kill()
            global _pool
            if pool is _pool:
                _pool = None
        del store


def _collect(pool: _Pool, world_size: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    results: dict[int, object] = {}
    errors: dict[int, str] = {}
    first_error_at = None
    while len(results) + len(errors) < world_size:
        now = time.monotonic()
        if first_error_at is not None and now - first_error_at > GRACE_AFTER_FAILURE:
            break
        if now > deadline:
            break
        try:
            rank, status, payload = pool.results.get(timeout=0.05)
        except queue.Empty:
            dead = [r for r in range(world_size)
                    if r not in results and r not in errors and not pool.procs[r].is_alive()]
            for r in dead:
                errors[r] = f"rank {r} died ({_describe_exit(pool.procs[r].exitcode)}) without reporting"
            if dead and first_error_at is None:
                first_error_at = time.monotonic()
            continue
        if status == "ok":
            results[rank] = pickle.loads(payload)
        else:
            errors[rank] = f"rank {rank} raised:\n{payload}"
            if first_error_at is None:
                first_error_at = time.monotonic()
    missing = [r for r in range(world_size) if r not in results and r not in errors]
    if errors or missing:
        parts = [errors[r] for r in sorted(errors)]
        if missing:
            why = "timed out" if first_error_at is None else "were killed after another rank failed"
            parts.append(f"ranks {missing} did not finish ({why}; timeout {timeout:.0f}s)")
            parts += _stacks(pool, missing)
        failed = sorted(errors) + missing
        raise RankError(f"{len(failed)} of {world_size} ranks failed: {failed}\n\n" + "\n\n".join(parts))
    return [results[r] for r in range(world_size)]


def _stacks(pool: _Pool, ranks: list[int]) -> list[str]:
    """Every thread's stack in each of ``ranks`` (still running: hung or slow), as faulthandler prints it."""
    for r in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pool.procs[r].pid, signal.SIGUSR1)
    time.sleep(0.5)
    out = []
    for r in ranks:
        try:
            with open(pool.stacks[r]) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            out.append(f"rank {r}'s threads when it was given up on (most recent call first):\n{text}")
    return out


def _describe_exit(code) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
