"""The rank side of ``run_ranks``: a loop that runs jobs sent by the parent.

Test modules are imported by pytest in importlib mode under names that are not importable
(``packages.pt-dist.tests.test_store``), so functions travel as (module name, file, qualname)
and the worker loads the file itself.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import importlib
import importlib.util
import os
import pickle
import signal
import sys
import tempfile
import traceback
import types
from dataclasses import dataclass

_store = None


def stacks_path(rank: int) -> str:
    """A fresh file (named by the parent, in its temp dir) where a rank writes every thread's stack when the parent
    sends it SIGUSR1 (a hang): the rank's own TMPDIR may differ, through ``run_ranks(env=...)``."""
    fd, path = tempfile.mkstemp(prefix=f"harness-stacks-{os.getpid()}-r{rank}-", suffix=".txt")
    os.close(fd)
    return path


def store():
    """Inside a rank: a client of the parent's TCPStore, for test-side rendezvous (e.g. publishing a port)."""
    if _store is None:
        raise RuntimeError("harness.store() is only available inside a rank started by run_ranks")
    return _store


@dataclass(frozen=True)
class FnRef:
    module: str
    file: str | None
    qualname: str

    @classmethod
    def of(cls, fn) -> FnRef:
        qualname = getattr(fn, "__qualname__", "")
        if "<locals>" in qualname or "<lambda>" in qualname or not qualname:
            raise TypeError(f"run_ranks needs a module-level function, got {fn!r}: ranks import it by name")
        mod = sys.modules.get(fn.__module__)
        return cls(fn.__module__, getattr(mod, "__file__", None), qualname)

    def resolve(self):
        mod = _load_module(self.module, self.file)
        obj = mod
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj


def _load_module(name: str, file: str | None):
    if name in sys.modules:
        return sys.modules[name]
    try:
        mod = importlib.import_module(name)
        if file is None or os.path.abspath(getattr(mod, "__file__", "") or "") == os.path.abspath(file):
            return mod
    except ImportError:
        if file is None:
            raise
    # Placeholder parents so pickle's __import__ of the dotted name resolves.
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent not in sys.modules:
            sys.modules[parent] = types.ModuleType(parent)
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _setup(rank: int, job: dict):
    global _store
    import torch
    import torch.distributed as dist

    world_size, timeout = job["world_size"], datetime.timedelta(seconds=job["timeout"])
    # As torchrun does (OMP_NUM_THREADS=1 unless set): ranks share the host's cores.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1"})
    _store = dist.TCPStore("127.0.0.1", job["store_port"], world_size + 1, is_master=False, timeout=timeout)
    backend = job["backend"]
    if backend is None:
        return
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())

    def connect(prefix: str) -> None:
        dist.init_process_group(backend, store=dist.PrefixStore(prefix, _store), rank=rank,
                                world_size=world_size, timeout=timeout)

    if backend == "gloo":
        init_gloo_together(_store, rank, world_size, connect, dist.destroy_process_group)
    else:
        connect("pg")


# gloo's connectFullMesh now and then fails on one rank ("Connection closed by peer") while the others
# connect: an upstream flake (pytorch/pytorch#53270, #53138, #57469), seen once in this suite's CI. The
# ranks then agree through the store and all retry under a fresh prefix.
GLOO_INIT_TRIES = 3


def init_gloo_together(store, rank: int, world_size: int, connect, destroy) -> int:
    """``connect(prefix)`` on every rank until all succeed together; returns the attempts it took."""
    for attempt in range(GLOO_INIT_TRIES):
        prefix = f"pg{attempt}" if attempt else "pg"
        try:
            connect(prefix)
            failure = None
        except RuntimeError as e:
            if "connectFullMesh" not in str(e) or attempt == GLOO_INIT_TRIES - 1:
                raise
            failure = e
        store.set(f"{prefix}/verdict/{rank}", "0" if failure else "1")
        if all(store.get(f"{prefix}/verdict/{r}") == b"1" for r in range(world_size)):
            return attempt + 1
        if failure is None:
            destroy()
        print(f"harness: rank {rank}: gloo init attempt {attempt + 1} failed on some rank "
              f"({failure or 'a peer failed'}); all ranks retry", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


# c10d-style modules whose default group a job may leave up: destroyed after it, so the next job on the pooled
# rank starts clean (looked up in sys.modules, never imported here)
_C10D_MODULES = ("torch.distributed", "pt_dist")


def _teardown():
    global _store
    for name in _C10D_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "is_available", lambda: True)() and mod.is_initialized():
            mod.destroy_process_group()
    _store = None


class _Fresh:
    """What a job may change process-wide, put back as a fresh rank had it before the next job: the parent's
    environment as of this call (sent with each job), working directory, default dtype, grad mode, RNG states."""

    def __init__(self):
        import random

        import torch

        self.cwd, self.torch_rng, self.py_rng = os.getcwd(), torch.get_rng_state(), random.getstate()

    def apply(self, environ: dict) -> None:
        import random

        import torch

        os.environ.clear()
        os.environ.update(environ)
        os.chdir(self.cwd)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.set_rng_state(self.torch_rng)
        random.setstate(self.py_rng)


def worker_main(rank: int, commands, results, stacks_file: str, parent: int) -> None:
    """Run jobs until told to stop; on failure the parent kills this process with the pool. A rank whose parent
    died without stopping it (pytest killed: no session teardown) exits instead of waiting forever."""
    import queue

    import torch.distributed  # noqa: F401 - the slow import happens before the job's clock starts

    # a hung rank is asked for its stacks before it is killed (faulthandler writes them from the signal handler,
    # whatever the main thread is stuck in), so a timeout says where each thread was
    stacks = open(stacks_file, "w")  # noqa: SIM115 - open for the life of the process
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    fresh = _Fresh()
    results.put((rank, "ready", None))
    while True:
        try:
            job = commands.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # reparented: the parent is gone
                with contextlib.suppress(OSError):
                    os.unlink(stacks_file)
                return
            continue
        if job is None:
            return
        try:
            fresh.apply(job["environ"])
            _setup(rank, job)
            fn = job["fn"].resolve()
            args = pickle.loads(job["args"])
            out = fn(rank, job["world_size"], *args)
            _teardown()
            payload = pickle.dumps(out)
        except BaseException:  # noqa: BLE001 - report everything, including SystemExit, to the parent
            results.put((rank, "error", traceback.format_exc()))
            continue
        results.put((rank, "ok", payload))
