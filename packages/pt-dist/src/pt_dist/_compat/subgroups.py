"""torch's sub-group helpers over ``new_group`` (``subgroups.py``): ``new_subgroups`` /
``new_subgroups_by_enumeration``, and ``split_group`` (a parent group cut into disjoint children in one call, what
NCCL's ``ncclCommSplit`` does).

The helpers cut the world into disjoint groups, what hybrid sharding (FSDP's HYBRID_SHARD: shard within a host,
replicate across hosts) and Megatron's layouts are built from; overlapping lists are refused before any group is
made.
"""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist._infra.store import PrefixStore
from pt_dist.backends.registry import Backend, library_options_for
from pt_dist.distributed_c10d import GroupMember, _group, _positive_seconds, _world
from pt_dist.subgroups import _check_same_call, new_group

__all__ = ["new_subgroups", "new_subgroups_by_enumeration", "split_group"]


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
