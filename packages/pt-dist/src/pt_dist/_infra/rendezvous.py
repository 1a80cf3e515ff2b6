"""Rendezvous: turn an ``init_method`` URL (or the torchrun environment) into a store, a rank and a size.

The three schemes of torch.distributed.rendezvous: ``env://`` reads MASTER_ADDR, MASTER_PORT, RANK and
WORLD_SIZE (what torchrun exports); ``tcp://host:port`` names the TCPStore master directly; ``file:///path``
uses a FileStore on a shared filesystem. Under torchrun the agent already serves torch's own TCPStore on
MASTER_PORT (``TORCHELASTIC_USE_AGENT_STORE=True``), so rank 0 starts ours on a free port beside it and the
agent's store carries only that port, under a key per restart and per init. ``?rank=``, ``?world_size=``
and ``?secret=`` query parameters are accepted as in torch; the secret (else ``$PT_DIST_SECRET``, else a random
one shared through a private file on one host: ``secret.py``) guards the TCPStore, and ``init_process_group``
then hands the backends' sockets a fresh random secret through it.
"""

from __future__ import annotations

import datetime
import itertools
import os
from dataclasses import dataclass
from urllib.parse import parse_qs, urlparse

from pt_dist._infra import secret as _secret
from pt_dist._infra.file_store import FileStore
from pt_dist._infra.store import PrefixStore, Store, TCPStore


@dataclass
class Rendezvous:
    store: Store
    rank: int
    world_size: int


_GENERATION = itertools.count()  # every rank calls init_process_group the same number of times


class _OwnedPrefixStore(PrefixStore):
    """A key space of a store this rendezvous opened: closing it closes (signs off from) that store."""

    def close(self) -> None:
        self.underlying_store.close()


def _int(value, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"rendezvous: {what} must be an integer, got {value!r}") from None


def _env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"rendezvous env://: environment variable {name} is not set (torchrun sets MASTER_ADDR, "
                         f"MASTER_PORT, RANK and WORLD_SIZE)")
    return value


def rendezvous(init_method: str, rank: int = -1, world_size: int = -1, timeout: float = 600.0) -> Rendezvous:
    """The store, rank and size ``init_method`` names (torch.distributed.rendezvous, which yields them instead)."""
    url = urlparse(init_method)
    if url.scheme not in ("env", "tcp", "file"):  # torch's class and words; ours are these three
        raise RuntimeError(f"No rendezvous handler for {url.scheme}:// (init_method {init_method!r}; use env://, "
                           f"tcp://host:port or file:///path)")
    query = {k: v[-1] for k, v in parse_qs(url.query).items()}
    if (rank != -1 or world_size != -1) and ("rank" in query or "world_size" in query):
        raise AssertionError(f"The url: {init_method} has node-specific arguments(rank, world_size) already; pass "
                             f"them in the url or as arguments, not both")
    if "rank" in query:
        rank = _int(query["rank"], "rank")
    if "world_size" in query:
        world_size = _int(query["world_size"], "world_size")
    secret = query.get("secret")
    if url.scheme == "env":
        host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), _int(_env("MASTER_PORT"), "MASTER_PORT")
        rank = rank if rank >= 0 else _int(_env("RANK"), "RANK")
        world_size = world_size if world_size >= 0 else _int(_env("WORLD_SIZE"), "WORLD_SIZE")
    elif url.scheme == "tcp":
        if not url.hostname or url.port is None:
            raise ValueError(f"rendezvous: port number missing in {init_method!r} (want tcp://host:port)")
        host, port = url.hostname, url.port
    else:
        path = url.path
        if not path:
            raise ValueError(f"rendezvous: file path missing in {init_method!r} (want file:///absolute/path)")
    if rank < 0:
        raise ValueError(f"rendezvous {init_method!r}: rank parameter missing (pass rank= or ?rank=)")
    if world_size < 0:
        raise ValueError(f"rendezvous {init_method!r}: size parameter missing (pass world_size= or ?world_size=)")
    if world_size < 1:
        raise ValueError(f"rendezvous: world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rendezvous: rank {rank} is outside world_size {world_size}")
    if url.scheme == "file":
        # unlike a TCPStore the file outlives the group: each init gets its own key space (the k-th group of
        # world_size users of the file is init k), so a re-init never reads the last one's keys
        fs = FileStore(path, world_size, timeout=timeout)
        store = _OwnedPrefixStore(f"init{(fs.opened_as - 1) // world_size}", fs)
        return Rendezvous(store, rank, world_size)
    if _secret.given(secret) is None:
        _secret.refuse_multi_host(host, port)  # on every rank at once, before any of them waits for another
    if url.scheme == "env" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() in ("1", "true"):
        return Rendezvous(_beside_agent_store(host, port, rank, world_size, timeout, secret), rank, world_size)
    store = TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout, multi_tenant=True, secret=secret)
    return Rendezvous(store, rank, world_size)


def _beside_agent_store(host: str, port: int, rank: int, world_size: int, timeout: float,
                        key: str | None) -> TCPStore:
    """torchrun's agent holds MASTER_PORT with a torch TCPStore: find our own store through it."""
    import torch.distributed as dist

    agent = dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout))
    slot = f"pt_dist/store/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_GENERATION)}"
    if rank == 0:
        ours = TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout, secret=key)
        agent.set(slot, f"{ours.port}")
        return ours
    return TCPStore(host, int(agent.get(slot)), world_size, timeout=timeout, secret=key)


def is_torchelastic_launched() -> bool:
    """Whether torchrun (torch.distributed.elastic) started this process: it sets ``TORCHELASTIC_RUN_ID``."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its host: torchrun's ``LOCAL_RANK``, else ``fallback_rank``, as torch's."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not in the environment (torchrun sets it); pass fallback_rank= to run "
                       "outside a multi-process launch")
