"""Helpers the rank functions share (imported by path: test modules put this folder on sys.path)."""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import random
import socket
import threading

import pt_dist
import torch
from pt_dist import ReduceOp
from pt_dist._infra.store import PrefixStore, TCPStore
from pt_dist.backends.tcp import ProcessGroupTCP

import harness


def free_port() -> int:
    """A free port below the kernel's ephemeral range, so sockets bound to port 0 later cannot take it first."""
    for _ in range(100):
        port = random.randint(20000, 32000)
        with contextlib.closing(socket.socket()) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found in 20000-32000")


def open_segments() -> list[str]:
    """This process's descriptors and mappings of pt_dist's shared-memory segments (an unlinked segment's memory
    stays held while either is left)."""
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    with open("/proc/self/maps") as maps:
        mapped = [line.split(None, 5)[-1].strip() for line in maps]
    return [f"fd {f}" for f in fds if "pt_dist_" in f] + [f"mapped {m}" for m in mapped if "pt_dist_" in m]


def join(rank: int, world_size: int, backend: str, timeout: float = 30.0, key: str = "ptd", **init_kwargs) -> None:
    """init_process_group on a store rank 0 binds on port 0 (port published through the harness store)."""
    if rank == 0:
        store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout)
        harness.store().set(f"{key}_port", str(store.port))
    else:
        port = int(harness.store().get(f"{key}_port"))
        store = TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
    pt_dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **init_kwargs)


def leave() -> None:
    """Destroy after everyone is done (rank 0 hosts the store, so it must not vanish first)."""
    if pt_dist.is_initialized():
        pt_dist.barrier()
        pt_dist.destroy_process_group()


def reference(xs: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """Reduce in float64/complex128 (or any/all for bool), independent of the backends' combine code."""
    s = torch.stack([x.contiguous() for x in xs])
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        fold = {ReduceOp.BAND: operator.and_, ReduceOp.BOR: operator.or_, ReduceOp.BXOR: operator.xor}[op]
        return functools.reduce(fold, [x.to(torch.int64) for x in s]).to(s.dtype)
    if s.dtype == torch.bool:
        return s.any(0) if op in (ReduceOp.SUM, ReduceOp.MAX) else s.all(0)
    wide = s.to(torch.complex128 if s.dtype.is_complex else torch.float64)
    out = {ReduceOp.SUM: lambda: wide.sum(0), ReduceOp.AVG: lambda: wide.mean(0),
           ReduceOp.PRODUCT: lambda: wide.prod(0), ReduceOp.MIN: lambda: wide.amin(0),
           ReduceOp.MAX: lambda: wide.amax(0)}[op]()
    return out.to(s.dtype)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        wide = torch.complex128 if a.dtype.is_complex else torch.float64
        rtol = 2e-2 if a.dtype == torch.bfloat16 else 1e-5
        return torch.allclose(a.to(wide), b.to(wide), rtol=rtol, atol=rtol)
    return torch.equal(a, b)


class Checks:
    """``check(name, got, want)`` counts every comparison and keeps the mismatches, so a rank reports both and a
    test that silently compared nothing fails too."""

    def __init__(self, label: str):
        self.label, self.fails, self.count = label, [], 0

    def __call__(self, name: str, got: torch.Tensor, want: torch.Tensor, compare=None) -> None:
        self.count += 1
        if not (compare or close)(got, want):
            self.fails.append(f"{self.label} {name}: got {got.flatten()[:6]} want {want.flatten()[:6]}")


def two_tcp_groups(name: str, timeout: float = 10.0, **kwargs) -> list:
    """Two tcp groups of one process, ranks 0 and 1, built concurrently (each waits for the other's mesh)."""
    master = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=10, secret=b"s")
    groups = [None, None]

    def make(rank):
        store = PrefixStore(name, TCPStore("127.0.0.1", master.port, timeout=10, secret=b"s"))
        groups[rank] = ProcessGroupTCP(store, rank, 2, timeout, name, secret=b"mesh", **kwargs)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    assert all(groups)
    groups[0].test_store = master  # keep the store (its server) alive as long as the groups
    return groups


def error_recorder(errors: dict):
    """``record(name, fn)``: run ``fn`` and keep what it raised in ``errors[name]`` as (type name, message), or
    None; the bad-input tests compare the types and words with torch's."""

    def record(name, fn):
        try:
            fn()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - the type and words are what the test compares
            errors[name] = (type(e).__name__, str(e))

    return record
