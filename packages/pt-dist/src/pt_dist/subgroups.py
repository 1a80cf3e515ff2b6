"""Making sub-groups: ``new_group``, torch's helpers ``new_subgroups`` / ``new_subgroups_by_enumeration``, and
``split_group`` (a parent group cut into disjoint children in one call, what NCCL's ``ncclCommSplit`` does).

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
from pt_dist._infra.errors import DistError, DistStoreError
from pt_dist._infra.store import PrefixStore
from pt_dist.backends import Backend, library_options_for
from pt_dist.distributed_c10d import GroupMember, _group, _positive_seconds, _world

__all__ = ["new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"]


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
    options = library_options_for(name, pg_options, device_id, "new_group")
    if Backend.is_torch_backed(name) and not Backend.is_torch_backed(world.name()):
        raise ValueError(f"new_group: a {name!r} sub-group needs a torch-backed default group, the default is "
                         f"{world.name()!r}")
    t = _positive_seconds(timeout, "new_group")  # before the group counters move: a refused call leaves no trace
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


def _check_same_call(group_name: str, ranks: list[int], me: int, timeout: float, what: str | None = None,
                     call: str = "new_group") -> None:
    """Every member posts what its n-th ``call`` asked for (``what``: the rank list) and compares, so ranks that
    create groups in different orders raise at once, saying so, instead of meeting the wrong peers (or none).
    Others touch nothing: a rank that is not a member may come late, when the store's host has moved on (and,
    done, destroyed its groups and the store with them)."""
    if me not in ranks:
        return
    mine = what if what is not None else ",".join(map(str, ranks))
    store = PrefixStore(f"pt_dist/{call}/{group_name}", _world.store)
    store.set(str(me), mine)
    deadline = time.monotonic() + timeout
    try:
        store.wait([str(r) for r in ranks], timeout)
    except DistStoreError:
        if time.monotonic() < deadline:
            raise  # the store itself failed, not a late rank
        missing = [r for r in ranks if not store.check([str(r)])]
        raise DistError(f"{call}: rank(s) {missing} did not create {group_name!r} (ranks {ranks}) within "
                        f"{timeout:.1f}s; every rank must call {call}, in the same order") from None
    for r in ranks:
        theirs = store.get(str(r)).decode()
        if theirs != mine:
            shown = (f"ranks {ranks}", f"[{theirs}]") if what is None else (mine, theirs)
            raise DistError(f"{call}: ranks called {call} in different orders: the call that makes "
                            f"{group_name!r} is {shown[0]} on rank {me} but {shown[1]} on rank {r}; every rank "
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


def split_group(parent_pg=None, split_ranks: list[list[int]] | None = None, timeout=None, pg_options=None,
                group_desc: str | None = None, backend: str | None = None):
    """Cut ``parent_pg`` (default: the world) into disjoint groups of *its* ranks, each keeping its list's order
    (position = rank in the child). Every member of the parent calls it with the same lists; a rank in none gets
    ``GroupMember.NON_GROUP_MEMBER``. Torch's groups split through torch's own ``split_group``."""
    parent = _group(parent_pg)
    size, me = parent.size(), parent.rank()
    if not split_ranks or not isinstance(split_ranks, (list, tuple)):
        raise ValueError(f"split_group: split_ranks must be a non-empty list of rank lists, got {split_ranks!r}")
    owner: dict[int, int] = {}
    for i, ranks in enumerate(split_ranks):
        if not isinstance(ranks, (list, tuple)) or not ranks:
            raise ValueError(f"split_group: split_ranks[{i}] must be a non-empty list of ranks, got {ranks!r}")
        for r in ranks:
            if not isinstance(r, int) or not 0 <= r < size:
                raise ValueError(f"split_group: rank {r!r} in split_ranks[{i}] is not a rank of the parent group "
                                 f"(size {size})")
            if r in owner:
                where = f"twice in split_ranks[{i}]" if owner[r] == i else f"in split_ranks[{owner[r]}] and [{i}]"
                raise ValueError(f"split_group: rank {r} is {where}")
            owner[r] = i
    name = parent.name()
    if backend is not None and Backend(backend) != name:
        raise ValueError(f"split_group: backend={backend!r} differs from the parent group's {name!r}")
    options = library_options_for(name, pg_options, None, "split_group")
    t = _positive_seconds(timeout, "split_group") if timeout is not None else getattr(parent, "timeout",
                                                                                        _world.timeout)
    count = _world.split_counts[parent.group_name] = _world.split_counts.get(parent.group_name, 0) + 1
    tag = f"{parent.group_name}:split{count}"
    parent_global = _world.ranks[parent]
    _check_same_call(tag, list(range(size)), me, t, repr([list(r) for r in split_ranks]), "split_group")
    mine = split_ranks[owner[me]] if me in owner else None
    group_name = f"{tag}:{owner[me]}" if mine is not None else tag
    if Backend.is_torch_backed(name):
        pg = parent.split(split_ranks, t, group_name, group_desc, **options)
        if pg is None:
            return GroupMember.NON_GROUP_MEMBER
    elif mine is None:
        return GroupMember.NON_GROUP_MEMBER
    else:
        global_ranks = [parent_global[r] for r in mine]
        pg = Backend.creator(name)(PrefixStore(group_name, _world.store), list(mine).index(me), len(mine), t,
                                   group_name, _world.secret, global_ranks)
    pg.group_desc = group_desc or group_name
    _world.ranks[pg] = [parent_global[r] for r in mine]
    return pg
