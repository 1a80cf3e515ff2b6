"""Making sub-groups: ``new_group`` (torch's ``distributed_c10d.new_group``).

Every rank calls ``new_group`` for every group, in the same order (each call takes the next group id, so ranks agree
on the store namespace without talking); members then compare the rank lists they were given, so a different order
raises at once. With ``use_local_synchronization`` only the members call, and the group is named by its ranks.
Non-members get ``GroupMember.NON_GROUP_MEMBER``. torch's helpers over it (``new_subgroups``, ``split_group``) are
``_compat/subgroups.py``.
"""

from __future__ import annotations

import time

from pt_dist._infra.errors import DistError, DistStoreError
from pt_dist._infra.store import PrefixStore
from pt_dist.backends.registry import Backend, library_options_for
from pt_dist.distributed_c10d import GroupMember, _group, _positive_seconds, _world

__all__ = ["new_group"]


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
    if Backend.is_torch_backed(name):  # torch makes it collectively: every rank of the world calls
        pg = Backend.creator(name).new_subgroup(ranks, t, group_name, use_local_synchronization=
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
