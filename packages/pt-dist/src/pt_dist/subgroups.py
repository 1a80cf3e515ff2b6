"""Making sub-groups: ``new_group``, and torch's helpers ``new_subgroups`` / ``new_subgroups_by_enumeration``.

Every rank calls ``new_group`` for every group, in the same order (each call takes the next group id, so
ranks agree on the store namespace without talking); members then compare the rank lists they were
given, so a different order raises at once. With ``use_local_synchronization`` only the members call,
and the group is named by its ranks. The helpers cut the world into disjoint groups, what hybrid sharding
(FSDP's HYBRID_SHARD: shard within a host, replicate across hosts) and Megatron's layouts are built from;
overlapping lists are refused before any group is made.
"""

from __future__ import annotations

import time

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist.backends import Backend
from pt_dist.distributed_c10d import GroupMember, _group, _library_options, _seconds, _world
from pt_dist.errors import DistError, DistStoreError
from pt_dist.store import PrefixStore

__all__ = ["new_group", "new_subgroups", "new_subgroups_by_enumeration"]


def new_group(ranks=None, timeout=None, backend: str | None = None, pg_options=None,
              use_local_synchronization: bool = False, group_desc: str | None = None, device_id=None):
    """A sub-group of ``ranks`` (global ranks; ``None``: all). Every rank calls it, in the same order; with
    ``use_local_synchronization`` only the members do (the same order among them), as torch's. ``pg_options``
    and ``device_id`` go to torch's groups, as in init_process_group."""
    world = _group(None)
    size = world.size()
    ranks = list(range(size)) if ranks is None else sorted(int(r) for r in ranks)
    if not ranks or len(set(ranks)) != len(ranks) or any(not 0 <= r < size for r in ranks):
        raise ValueError(f"new_group: ranks={ranks} must be distinct ranks in [0, {size})")
    name = Backend(backend or world.name())
    options = _library_options(name, pg_options, device_id, "new_group")
    if Backend.is_torch_backed(name) and not Backend.is_torch_backed(world.name()):
        raise ValueError(f"new_group: a {name!r} sub-group needs a torch-backed default group, the default is "
                         f"{world.name()!r}")
    me = world.rank()
    if use_local_synchronization:  # named by its members alone: the others never call
        if me not in ranks:
            return GroupMember.NON_GROUP_MEMBER
        key = tuple(ranks)
        _world.local_counts[key] = _world.local_counts.get(key, 0) + 1
        group_name = f"group[{','.join(map(str, ranks))}]#{_world.local_counts[key]}"
    else:
        _world.group_count += 1
        group_name = f"group{_world.group_count}"
    t = _seconds(timeout)
    _check_same_call(group_name, ranks, me, t)
    if Backend.is_torch_backed(name):
        from pt_dist.backends.torch_adapter import TorchProcessGroup

        pg = TorchProcessGroup.new_subgroup(name, ranks, t, group_name, use_local_synchronization=
                                            use_local_synchronization, group_desc=group_desc, **options)
        if pg is None:
            return GroupMember.NON_GROUP_MEMBER
    else:
        if me not in ranks:
            return GroupMember.NON_GROUP_MEMBER
        pg = Backend.creator(name)(PrefixStore(group_name, _world.store), ranks.index(me), len(ranks), t,
                                   group_name, _world.secret, ranks)
    pg.group_desc = group_desc or group_name
    _world.ranks[pg] = ranks
    return pg


def _check_same_call(group_name: str, ranks: list[int], me: int, timeout: float) -> None:
    """Every rank posts which ranks its n-th new_group names; members compare, so ranks that create groups in
    different orders raise at once, saying so, instead of meeting the wrong peers (or none) in one namespace."""
    store, mine = PrefixStore(f"pt_dist/new_group/{group_name}", _world.store), ",".join(map(str, ranks))
    store.set(str(me), mine)
    if me not in ranks:
        return
    deadline = time.monotonic() + timeout
    try:
        store.wait([str(r) for r in ranks], timeout)
    except DistStoreError:
        if time.monotonic() < deadline:
            raise  # the store itself failed, not a late rank
        missing = [r for r in ranks if not store.check([str(r)])]
        raise DistError(f"new_group: rank(s) {missing} did not create {group_name!r} (ranks {ranks}) within "
                        f"{timeout:.1f}s; every rank must call new_group, in the same order") from None
    for r in ranks:
        theirs = store.get(str(r)).decode()
        if theirs != mine:
            raise DistError(f"new_group: ranks called new_group in different orders: the call that makes "
                            f"{group_name!r} is ranks {ranks} on rank {me} but [{theirs}] on rank {r}; every rank "
                            f"must create the same groups in the same order")


def new_subgroups_by_enumeration(ranks_per_subgroup_list: list[list[int]], timeout=None, backend=None,
                                 pg_options=None, group_desc: str | None = None):
    """One group per list of global ranks; returns (this rank's group or ``None``, every group in order)."""
    if not ranks_per_subgroup_list:
        raise ValueError("new_subgroups_by_enumeration: ranks_per_subgroup_list cannot be empty")
    owner: dict[int, list[int]] = {}
    for ranks in ranks_per_subgroup_list:
        for r in ranks:
            if r in owner:
                raise ValueError(f"new_subgroups_by_enumeration: rank {r} is in both {owner[r]} and {list(ranks)}")
            owner[r] = list(ranks)
    me = c10d.get_rank()
    mine, groups = None, []
    for ranks in ranks_per_subgroup_list:
        group = new_group(ranks, timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)
        groups.append(group)
        if me in ranks:
            mine = group
    return mine, groups


def new_subgroups(group_size: int | None = None, group=None, timeout=None, backend=None, pg_options=None,
                  group_desc: str | None = None):
    """Consecutive blocks of ``group_size`` ranks of ``group`` (default: the GPUs of one host, as torch's)."""
    if group_size is None:
        if not torch.cuda.is_available():
            raise ValueError("new_subgroups: without CUDA devices there is no default group_size (the GPUs per "
                             "host); pass group_size")
        group_size = torch.cuda.device_count()
    world = c10d.get_world_size(group)
    if not isinstance(group_size, int) or group_size <= 0 or world % group_size:
        raise ValueError(f"new_subgroups: group_size={group_size!r} must be a positive divisor of the group's "
                         f"size {world}")
    ranks = c10d.get_process_group_ranks(c10d._group(group))
    mine, groups = new_subgroups_by_enumeration([ranks[i:i + group_size] for i in range(0, world, group_size)],
                                                timeout=timeout, backend=backend, pg_options=pg_options,
                                                group_desc=group_desc)
    return mine, groups
