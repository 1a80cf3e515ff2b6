"""Process-group management in torch.distributed's style (torch/distributed/distributed_c10d.py).

``init_process_group`` runs the rendezvous, builds the default group through the backend registry,
and the module-level collectives route to a group (default: the world). Module-level functions take
*global* ranks for ``src``/``dst`` and translate them to the group's ranks, as torch does.
Sub-groups come from ``new_group`` (``subgroups.py``); non-members get ``GroupMember.NON_GROUP_MEMBER`` and their
collectives on it return ``None``.
"""

from __future__ import annotations

import datetime
import logging
import warnings

import torch

from pt_dist._infra.errors import DistError
from pt_dist._infra.rendezvous import get_node_local_rank, is_torchelastic_launched, rendezvous
from pt_dist._infra.secret import mesh_secret
from pt_dist._infra.store import PrefixStore, Store, TCPStore
from pt_dist._infra.store import _seconds as store_seconds
from pt_dist.backends.arguments import as_rank
from pt_dist.backends.registry import Backend, check_available, library_options_for
from pt_dist.process_group import ProcessGroup, ReduceOp

log = logging.getLogger(__name__)
default_pg_timeout = datetime.timedelta(minutes=10)


class GroupMember:
    WORLD: ProcessGroup | None = None
    NON_GROUP_MEMBER = object()


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:  # noqa: N802 - torch's spelling
        return GroupMember.WORLD


class group(metaclass=_WorldMeta):  # noqa: N801 - torch's spelling: ``dist.group.WORLD``
    """``group.WORLD``: the default group (``None`` before init), as ``GroupMember.WORLD``."""


class _World:
    def __init__(self):
        self.store: Store | None = None
        self.secret = b""
        self.timeout = default_pg_timeout.total_seconds()
        self.ranks: dict[ProcessGroup, list[int]] = {}  # group -> global ranks, by group rank
        self.group_count = 0
        self.local_counts: dict[tuple[int, ...], int] = {}  # new_group(use_local_synchronization=True) per ranks
        self.split_counts: dict[str, int] = {}  # split_group calls per parent group
        self.owns_store = False


_world = _World()
# (on_init(pg, backend, store), on_destroy(pg)) pairs other layers add: _compat/torch_backend.py shares the world
# group with torch.distributed, so torch's own utilities (DistributedSampler, get_rank) see it
world_hooks: list[tuple] = []


def is_initialized() -> bool:
    return GroupMember.WORLD is not None


def _seconds(timeout) -> float:
    return _world.timeout if timeout is None else store_seconds(timeout)


def _positive_seconds(timeout, call: str) -> float:
    """``timeout`` (seconds or timedelta; None: the job's) in seconds, refused unless positive (torch: "Invalid
    timeout") on the rank that got it, before it meets any other."""
    t = _seconds(timeout)
    if not t > 0:
        raise ValueError(f"{call}: timeout must be positive, got {timeout!r}")
    return t


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout=None,
                       world_size: int = -1, rank: int = -1, store: Store | None = None,
                       group_name: str = "", pg_options=None, device_id: torch.device | int | None = None) -> None:
    """Join the job: rendezvous, then build the default group of ``backend`` ("tcp", "shm", "gloo", ...).

    ``device_id`` and ``pg_options`` go to torch's own group (``device_id`` picks the GPU under nccl); the native
    backends move CPU tensors, so they take no options and ``device_id`` may only be the CPU."""
    if is_initialized():
        raise ValueError("init_process_group: the default process group is already initialized; call "
                         "destroy_process_group() first")
    name = Backend(backend or "tcp")
    t = _positive_seconds(timeout if timeout is not None else default_pg_timeout, "init_process_group")
    library_options = library_options_for(name, pg_options, device_id)
    check_available(name)  # before we bind or connect anything
    owned = store is None  # a store we open here is ours to close if the init fails
    if store is not None:
        if init_method is not None:
            raise ValueError("init_process_group: pass either init_method or store, not both")
        if rank < 0 or world_size < 1:
            raise ValueError(f"init_process_group: a store needs explicit rank and world_size, got rank={rank}, "
                             f"world_size={world_size}")
        # a caller's store may serve init after init, as torch's may: a key space per init, no stale keys read
        store = PrefixStore(f"pt_dist/init{store.add(f'pt_dist/inits/{rank}', 1)}", store)
    else:
        rdzv = rendezvous(init_method or "env://", rank, world_size, t)
        store, rank, world_size = rdzv.store, rdzv.rank, rdzv.world_size
    try:
        secret = mesh_secret(store, rank)
        pg = Backend.creator(name)(PrefixStore("default_pg", store), rank, world_size, t, group_name or "default_pg",
                                   secret, None, **library_options)
    except BaseException:
        if owned and hasattr(store, "close"):
            store.close()  # a failed init must not keep the port (or file) from the next attempt
        raise
    _world.store, _world.secret, _world.timeout, _world.group_count = store, secret, t, 0
    _world.owns_store = owned  # the caller's store stays open after destroy_process_group, as in torch
    _world.local_counts.clear()
    _world.split_counts.clear()
    GroupMember.WORLD = pg
    _world.ranks[pg] = list(range(world_size))
    for on_init, _ in world_hooks:
        on_init(pg, name, PrefixStore("torch", store))
    log.info("pt_dist: rank %d/%d joined with backend %s", rank, world_size, name)


def is_available() -> bool:
    """Always: pt_dist needs only sockets (torch's answers whether it was built with distributed support)."""
    return True


def _rank_not_in_group(group, op_name: str) -> bool:
    """torch's: an operation on a group this rank is not in does nothing and returns None, with a UserWarning."""
    if group is not GroupMember.NON_GROUP_MEMBER:
        return False
    global_rank = -1 if GroupMember.WORLD is None else GroupMember.WORLD.rank()
    warnings.warn(f"Running {op_name} on global rank {global_rank} which does not belong to the given group.",
                  stacklevel=3)
    return True


def _group(group) -> ProcessGroup:
    if group is None:
        if GroupMember.WORLD is None:
            raise ValueError("pt_dist: the default process group is not initialized; call init_process_group()")
        return GroupMember.WORLD
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("pt_dist: this rank is not a member of the group")
    if group not in _world.ranks:
        raise ValueError(f"pt_dist: {group!r} is not registered (destroyed, or from another job; groups come "
                         f"from new_group)")
    return group


def destroy_process_group(group=None) -> None:
    """Shut down ``group`` (default: every group, then forget the rendezvous). Groups are forgotten first, so a
    collective the shutdown wakes in another thread finds no group (torch's order leaves that a race)."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if group is None or group is GroupMember.WORLD:  # the default group means everything, as in torch
        store, _world.store = _world.store if _world.owns_store else None, None
        if isinstance(store, TCPStore) and store.is_master:
            store.close()  # first, since the other ranks wait for it below
        if GroupMember.WORLD is not None:
            for _, on_destroy in world_hooks:
                on_destroy(GroupMember.WORLD)
        groups, GroupMember.WORLD = sorted(_world.ranks, key=lambda g: g is GroupMember.WORLD), None
        _world.ranks.clear()
        for pg in groups:
            pg.shutdown()
        if isinstance(store, TCPStore):
            if not store.is_master:
                # return only once the master's server is down: a re-init on the same port (tcp://, env://) could
                # otherwise reach the old server, which then vanishes under it
                store.close(wait_for_master=min(10.0, _world.timeout))
        elif hasattr(store, "close"):
            store.close()
        return
    pg = _group(group)
    del _world.ranks[pg]
    pg.shutdown()


def get_rank(group=None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).rank()


def get_world_size(group=None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).size()


def get_backend(group=None) -> str:
    return _group(group).name()


def get_backend_config(group=None) -> str:
    """Device type to backend, torch's format: ``"cpu:tcp"`` for ours, torch's own string for its groups."""
    pg = _group(group)
    return pg.backend_config() if hasattr(pg, "backend_config") else f"cpu:{pg.name()}"


def get_pg_count() -> int:
    """How many process groups this rank has created since init, the default one included (0 before init)."""
    if not is_initialized():
        return 0
    return 1 + _world.group_count + sum(_world.local_counts.values()) + sum(_world.split_counts.values())


def set_timeout(timeout, group=None) -> None:
    """The group's timeout (timedelta or seconds) for the operations issued from now on; groups made later keep
    init_process_group's, as in torch."""
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("set_timeout: this rank is not a member of the group")
    if timeout is None:
        raise ValueError("set_timeout: timeout must be positive, got None")
    _group(group).set_timeout(_positive_seconds(timeout, "set_timeout"))


def get_process_group_ranks(group) -> list[int]:
    return list(_world.ranks[_group(group)])


def get_global_rank(group, group_rank: int) -> int:
    ranks = _world.ranks[_group(group)]
    if not 0 <= (group_rank := as_rank(group_rank, "group_rank")) < len(ranks):
        raise ValueError(f"group rank {group_rank} is not part of group {_group(group).group_name!r} of size "
                         f"{len(ranks)}")
    return ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    ranks = _world.ranks[_group(group)]
    if (global_rank := as_rank(global_rank, "global rank")) not in ranks:
        raise ValueError(f"global rank {global_rank} is not part of group {_group(group).group_name!r} ({ranks})")
    return ranks.index(global_rank)


def _ret(work, async_op):
    return work if async_op else None


def _peer(group, rank, group_rank, what: str, default: int | None = None) -> int:
    """The group-local rank from torch's two spellings: ``src``/``dst`` (a global rank) or ``group_src``/
    ``group_dst`` (the group's own numbering), never both; neither means ``default`` (global rank 0 for
    gather, scatter and the object collectives, as torch's; broadcast, reduce and send need one named)."""
    if group_rank is not None:
        if rank is not None:
            raise ValueError(f"pass {what}={rank} or group_{what}={group_rank}, not both")
        size, index = _group(group).size(), as_rank(group_rank, f"group_{what}")
        if not 0 <= index < size:
            raise ValueError(f"group_{what}={group_rank!r} is not a rank of a group of size {size}")
        return index
    if rank is None:
        if default is None:
            raise ValueError(f"name the peer: {what}= (a global rank) or group_{what}= (the group's rank)")
        rank = default
    return get_group_rank(group, rank)


# module-level collectives: global ranks in (or group_src/group_dst), group-local ranks to the ProcessGroup -----
def broadcast(tensor, src: int | None = None, group=None, async_op: bool = False, group_src: int | None = None):
    if _rank_not_in_group(group, "broadcast"):
        return None
    return _ret(_group(group).broadcast(tensor, _peer(group, src, group_src, "src"), async_op=async_op), async_op)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
    if _rank_not_in_group(group, "all_reduce"):
        return None
    return _ret(_group(group).all_reduce(tensor, op, async_op=async_op), async_op)


def reduce(tensor, dst: int | None = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
           group_dst: int | None = None):
    if _rank_not_in_group(group, "reduce"):
        return None
    return _ret(_group(group).reduce(tensor, _peer(group, dst, group_dst, "dst"), op, async_op=async_op), async_op)


def all_gather(tensor_list, tensor, group=None, async_op: bool = False):
    """Every rank's ``tensor`` into ``tensor_list``. Complex tensors meet real ones of their element type as their
    ``view_as_real`` views, as torch's (a complex64 tensor of n into float32 outputs of 2n, and back)."""
    if _rank_not_in_group(group, "all_gather"):
        return None
    if isinstance(tensor_list, list) and all(isinstance(t, torch.Tensor) for t in [tensor, *tensor_list]):
        kinds = {t.is_complex() for t in [tensor, *tensor_list]}
        if len(kinds) == 2:
            tensor = torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor
            tensor_list = [_real_view(t, f"tensor_list[{i}]") for i, t in enumerate(tensor_list)]
    return _ret(_group(group).all_gather(tensor_list, tensor, async_op=async_op), async_op)


def _real_view(t: torch.Tensor, what: str) -> torch.Tensor:
    if not t.is_complex():
        return t
    if t.is_conj():  # (written through: a lazily conjugated view has no real view to write)
        raise ValueError(f"all_gather: {what} is a lazy .conj() view; resolve_conj() it to gather into it")
    return torch.view_as_real(t)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    if _rank_not_in_group(group, "all_gather_into_tensor"):
        return None
    return _ret(_group(group).all_gather_into_tensor(output_tensor, input_tensor, async_op=async_op), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
    if _rank_not_in_group(group, "reduce_scatter_tensor"):
        return None
    return _ret(_group(group).reduce_scatter_tensor(output, input, op, async_op=async_op), async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False):
    if _rank_not_in_group(group, "all_to_all_single"):
        return None
    return _ret(_group(group).all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                                async_op=async_op), async_op)


def gather(tensor, gather_list=None, dst: int | None = None, group=None, async_op: bool = False,
           group_dst: int | None = None):
    """``tensor`` of every rank into ``gather_list`` on ``dst`` (a global rank); other ranks pass no list."""
    if _rank_not_in_group(group, "gather"):
        return None
    root = _peer(group, dst, group_dst, "dst", default=0)
    return _ret(_group(group).gather(tensor, gather_list, root, async_op=async_op), async_op)


def scatter(tensor, scatter_list=None, src: int | None = None, group=None, async_op: bool = False,
            group_src: int | None = None):
    """``scatter_list[i]`` on ``src`` (a global rank) into ``tensor`` on the group's rank i."""
    if _rank_not_in_group(group, "scatter"):
        return None
    root = _peer(group, src, group_src, "src", default=0)
    return _ret(_group(group).scatter(tensor, scatter_list, root, async_op=async_op), async_op)


def symmetric_empty(*size, dtype=torch.float32, group=None) -> torch.Tensor:
    """A tensor in the group's symmetric heap (``shm`` groups; torch's ``_symmetric_memory.empty``): collective,
    every rank allocates the same sizes in the same order; all-reduces on it skip staging and kernel copies."""
    pg = _group(group)
    if not hasattr(pg, "symmetric_empty"):
        raise ValueError(f"symmetric_empty needs an 'shm' group; group {pg.group_name!r} is {pg.name()!r}")
    return pg.symmetric_empty(*size, dtype=dtype)


def barrier(group=None, async_op: bool = False, device_ids: list[int] | None = None, timeout=None):
    """``device_ids`` (torch's: the GPU whose stream NCCL's barrier runs on) go to NCCL; CPU backends need none.
    ``timeout`` (seconds or timedelta): this barrier's own; missing ranks then fail it as any timeout does."""
    if _rank_not_in_group(group, "barrier"):
        return None
    if device_ids is not None and not (isinstance(device_ids, list) and all(isinstance(d, int) for d in device_ids)):
        raise ValueError(f"barrier: device_ids must be a list of ints, got {device_ids!r}")
    t = None if timeout is None else _positive_seconds(timeout, "barrier")
    return _ret(_group(group).barrier(async_op=async_op, device_ids=device_ids, timeout=t), async_op)


def isend(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None):
    if _rank_not_in_group(group, "isend"):
        return None
    return _group(group).send(tensor, _peer(group, dst, group_dst, "dst"), tag)


def irecv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None):
    """Receive from ``src``; neither ``src`` nor ``group_src``: from whichever rank sends ``tag`` first (the Work's
    ``_source_rank()`` says which, in the group's numbering), as gloo's."""
    if _rank_not_in_group(group, "irecv"):
        return None
    any_source = src is None and group_src is None
    return _group(group).recv(tensor, None if any_source else _peer(group, src, group_src, "src"), tag)


def send(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None) -> None:
    if _rank_not_in_group(group, "send"):
        return
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None) -> int:
    """Blocking receive; returns the sender's global rank (as torch does)."""
    if _rank_not_in_group(group, "recv"):
        return -1
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    return get_global_rank(group, work._source_rank())


__all__ = ["DistError", "GroupMember", "ReduceOp", "all_gather", "all_gather_into_tensor", "all_reduce",
           "all_to_all_single", "barrier", "broadcast", "destroy_process_group", "gather", "get_backend",
           "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank",
           "get_node_local_rank", "get_world_size", "init_process_group", "irecv", "is_available",
           "is_initialized", "is_torchelastic_launched", "isend", "recv", "reduce", "reduce_scatter_tensor", "scatter",
           "send"]
