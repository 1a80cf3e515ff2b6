"""The shm backend's three all-reduce paths (one-barrier small, staged two-copy, single-copy cross-memory).

The path is chosen per call from the size and from the group's agreed cross-memory verdict: a rank that
cannot (here: will not) use process_vm_readv turns it off for the whole group, or ranks would run
different barrier sequences. Each slice is reduced by exactly one rank, so results are bitwise equal.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from pathlib import Path

import pt_dist
import pytest
import torch

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _self_read_works() -> bool:
    from pt_dist._infra.cma import CrossMemory

    cma, src, dst = CrossMemory(), torch.arange(4.0), torch.zeros(4)
    try:
        cma.read(os.getpid(), src.data_ptr(), dst.data_ptr(), 16)
    except OSError:
        return False
    return cma.available and torch.equal(src, dst)


def _paths(rank, world_size):
    from pt_dist._infra import cma

    util.join(rank, world_size, "shm", key="paths")
    everyone = pt_dist.GroupMember.WORLD
    if rank == 1:
        os.environ["PT_DIST_NO_CMA"] = "1"
    try:
        refused = pt_dist.new_group(list(range(world_size)), backend="shm")
    finally:
        os.environ.pop("PT_DIST_NO_CMA", None)
    out = {"verdicts": (everyone._use_cma, refused._use_cma), "self_read": _self_read_works()}
    n = (1 << 20) + 3  # odd, so slices differ in length; 4 MiB > CMA_BYTES, > SMALL_BYTES / world
    assert n * 4 >= cma.MIN_BYTES
    for name, group in (("single", everyone), ("staged", refused)):
        g = torch.Generator().manual_seed(rank)
        t = torch.randn(n, generator=g)
        want = sum(torch.randn(n, generator=torch.Generator().manual_seed(r)).double() for r in range(world_size))
        pt_dist.all_reduce(t, group=group)
        out[name] = (float((t.double() - want).abs().max()), t)
        if name == "single":  # one 4 MiB buffer twice: before the second, its pages are collapsed into huge ones
            again = t.clone()
            pt_dist.all_reduce(again, group=group)
            before = group.single_copy._huge.collapsed if group._use_cma else None
            pt_dist.all_reduce(again, group=group)
            out["again"] = torch.equal(again, (t * world_size) * world_size)
            out["collapsed"] = (before, group.single_copy._huge.collapsed if group._use_cma else None)
        mx = torch.randint(-1000, 1000, (n,), generator=g)
        pt_dist.all_reduce(mx, op=pt_dist.ReduceOp.MAX, group=group)
        out[name + " max"] = mx
        # the other single-copy collectives, on 1 MiB+ buffers: all-gather, reduce-scatter, broadcast
        m = (1 << 18) + 1
        mine = torch.arange(m, dtype=torch.float64) * (rank + 1)
        gathered = torch.empty(world_size * m, dtype=torch.float64)
        pt_dist.all_gather_into_tensor(gathered, mine, group=group)
        everyone = torch.cat([torch.arange(m, dtype=torch.float64) * (r + 1) for r in range(world_size)])
        scattered = torch.empty(m, dtype=torch.float64)
        pt_dist.reduce_scatter_tensor(scattered, everyone * (rank + 1), group=group)
        wide = everyone.view(world_size, m)[rank] * sum(r + 1 for r in range(world_size))
        b = torch.full((m,), float(rank))
        pt_dist.broadcast(b, src=world_size - 1, group=group)
        # async: the group's thread runs the single-copy path while this thread goes on
        works = [pt_dist.all_reduce(x, group=group, async_op=True) for x in (torch.ones(m), torch.ones(m) * 2)]
        sums = [w.get_future().wait()[0] for w in works]
        out[name + " others"] = (torch.equal(gathered, everyone), torch.equal(scattered, wide),
                                 torch.equal(b, torch.full((m,), float(world_size - 1))),
                                 [float(x.min()) == float(x.max()) == k * world_size for k, x in enumerate(sums, 1)])
    pt_dist.destroy_process_group(refused)
    # the single-copy threshold comes from each rank's environment: a group agrees on the largest, or ranks
    # would take different paths for one collective (each waiting for copies the others never make)
    default = cma.MIN_BYTES
    cma.MIN_BYTES = (8 << 20) if rank == 0 else default
    try:
        uneven = pt_dist.new_group(list(range(world_size)), backend="shm")
        m = 1 << 18  # 1 MiB of float32: single-copy for ranks 1 and 2 on their own, staged for rank 0
        a, b, g = torch.full((m,), rank + 1.0), torch.full((m,), float(rank)), torch.empty(world_size * m)
        pt_dist.all_reduce(a, group=uneven)
        pt_dist.broadcast(b, group_src=1, group=uneven)
        pt_dist.all_gather_into_tensor(g, torch.full((m,), float(rank)), group=uneven)
        out["uneven"] = (uneven._cma_bytes, float(a.min()), float(a.max()), float(b.min()), float(b.max()),
                         torch.equal(g, torch.arange(world_size * 1.0).repeat_interleave(m)))
        pt_dist.destroy_process_group(uneven)
    finally:
        cma.MIN_BYTES = default
    util.leave()
    return out


def test_single_copy_verdict_is_agreed_and_results_are_bitwise_equal():
    results = run_ranks(_paths, 3, timeout=120, backend=None)
    for r in results:
        # the default group uses cross-memory exactly when the kernel lets a process read itself here
        assert r["verdicts"] == (r["self_read"], False)
        if r["self_read"]:
            assert r["collapsed"] == (0, int(_collapse_works())), r["collapsed"]
        assert r["again"]
        for name in ("single", "staged"):
            assert r[name][0] < 1e-4, f"{name}: max error {r[name][0]}"
            assert r[name + " others"] == (True, True, True, [True, True]), name
    total = sum(range(1, len(results) + 1))
    agreed = 8 << 20 if results[0]["self_read"] else None
    assert all(r["uneven"] == (agreed, total, total, 1.0, 1.0, True) for r in results), [r["uneven"] for r in results]
    for name in ("single", "staged", "single max", "staged max"):
        ts = [r[name][1] if isinstance(r[name], tuple) else r[name] for r in results]
        assert all(torch.equal(ts[0], t) for t in ts[1:]), f"{name}: ranks disagree bitwise"
    assert torch.equal(results[0]["single max"], results[0]["staged max"])


def _two_groups_in_threads(name: str):
    import threading

    from pt_dist._infra.store import PrefixStore, TCPStore
    from pt_dist.backends.shm import process_group_shm as shm

    master = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=10)
    groups = [None, None]

    def make(rank):
        store = PrefixStore(name, TCPStore("127.0.0.1", master.port, timeout=10))
        groups[rank] = shm.ProcessGroupSHM(store, rank, 2, 10.0, name, b"s", single_copy=False)

    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    return groups


def test_a_tight_dev_shm_shrinks_the_staging_slots(monkeypatch):
    """Docker's 64 MB /dev/shm: slots shrink to what fits (touching a page past it would be a SIGBUS)."""
    import threading

    from pt_dist._infra import shm_segment as segment
    from pt_dist.backends.shm import process_group_shm as shm

    monkeypatch.setattr(segment, "free_bytes", lambda: 24 << 20)
    groups = _two_groups_in_threads("tight")
    assert all(groups) and groups[0].slot_bytes == groups[1].slot_bytes < 3 << 20 < shm.SLOT_BYTES
    n = 3 << 20  # 12 MiB of float32: staged in several rounds of the shrunken slots
    ts = [torch.arange(n, dtype=torch.float32) * (r + 1) for r in range(2)]
    works = [threading.Thread(target=groups[r].all_reduce, args=(ts[r],)) for r in range(2)]
    [w.start() for w in works]
    [w.join(30) for w in works]
    assert all(torch.equal(t, torch.arange(n, dtype=torch.float32) * 3) for t in ts)
    for g in groups:
        g.shutdown()
    monkeypatch.setattr(segment, "free_bytes", lambda: 1 << 20)
    from pt_dist._infra.store import PrefixStore, TCPStore

    with pytest.raises(pt_dist.DistError, match="shm-size"):
        shm.ProcessGroupSHM(PrefixStore("none", TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=5)), 0, 2,
                            5.0, "none", b"s", single_copy=False)


def test_running_out_of_dev_shm_mid_collective_raises_on_every_rank(monkeypatch):
    """Staging pages are reserved (fallocate) before first use, so a full /dev/shm is a DistError, not a SIGBUS."""
    import errno
    import threading

    from pt_dist._infra import shm_segment as segment

    groups = _two_groups_in_threads("full")

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(segment.os, "posix_fallocate", full)
    errors = []

    def run(rank):
        try:
            groups[rank].all_reduce(torch.ones(1 << 18)).wait()
        except pt_dist.DistError as e:
            errors.append(str(e))

    works = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [w.start() for w in works]
    [w.join(30) for w in works]
    assert len(errors) == 2 and all("no room in" in e and "shm-size" in e for e in errors), errors
    for g in groups:
        g.shutdown()


_MANY_GROUPS = '''
import threading, torch, pt_dist
from pt_dist.backends.shm import process_group_shm as shm
from pt_dist._infra.store import PrefixStore, TCPStore

master = TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False, timeout=10)
groups, errors = {}, []

def both(fn):
    ts = [threading.Thread(target=fn, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join(60) for t in ts]

def make(name, rank):
    store = PrefixStore(name, TCPStore("127.0.0.1", master.port, timeout=10))
    groups[name, rank] = shm.ProcessGroupSHM(store, rank, 2, 10.0, name, b"s", single_copy=False)

def run(name, rank):
    try:
        groups[name, rank].all_reduce(torch.ones(4 << 20)).wait()
    except pt_dist.DistError as e:
        errors.append(str(e))

names = "abcde"
for name in names:  # all made before any is used: each sees the whole filesystem free and sizes for it
    both(lambda r: make(name, r))
for name in names:
    both(lambda r: run(name, r))
print("ERRORS", len(errors), errors[:1])
'''


def test_many_shm_groups_overrunning_a_small_dev_shm_raise_instead_of_sigbus(tmp_path):
    """End to end in a real 24 MiB tmpfs (a private mount namespace): five groups sized alike, 16 MiB
    staged all-reduces on each. Without the page reservation the process dies of SIGBUS."""
    import shutil
    import subprocess

    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run([unshare, "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                                       capture_output=True)
    if not probe or probe.returncode != 0:
        pytest.skip("needs `unshare -rm` and a tmpfs mount (user or mount namespaces are not allowed here)")
    script = tmp_path / "many_groups.py"
    script.write_text(_MANY_GROUPS)
    cmd = f"mount -t tmpfs -o size=24m tmpfs /dev/shm && exec {sys.executable} {script}"
    out = subprocess.run([unshare, "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"rc={out.returncode} (SIGBUS is -7/135)\n{out.stdout}\n{out.stderr[-3000:]}"
    count = int(out.stdout.split("ERRORS ")[1].split()[0])
    assert count >= 2 and "no room in /dev/shm" in out.stdout and "shm-size" in out.stdout, out.stdout


def test_a_segment_no_peer_attaches_to_is_still_removed(tmp_path):
    """Rank 0 gives up on a peer that never maps the segment: it raises, and leaves no file in /dev/shm."""
    from pt_dist import DistError, FileStore
    from pt_dist._infra import shm_segment as segment

    pattern = os.path.join(segment.shm_dir(), f"pt_dist_{os.getpid()}_*")
    store = FileStore(str(tmp_path / "store"), 1, timeout=5)
    with pytest.raises(DistError, match="peers did not attach"):
        segment.map_shared_segment(store, 0, 2, 1 << 16, "seg", 0.3, "lonely")
    assert glob.glob(pattern) == []


def test_ranks_disagreeing_on_the_segment_size_both_fail_at_once():
    """Ranks started with different world sizes size the segment differently: the peer says so (it once failed
    with mmap's "length is greater than file size") and rank 0 stops waiting for it."""
    import threading

    from pt_dist import DistError, HashStore
    from pt_dist._infra import shm_segment as segment

    store, seen = HashStore(), {}

    def rank(r):
        t0 = time.monotonic()
        try:
            segment.map_shared_segment(store, r, 2, (1 << 16) * (r + 1), "seg", 20, "sizes").close()
        except DistError as e:
            seen[r] = (str(e), time.monotonic() - t0)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in threads], [t.join(30) for t in threads]
    assert "rank 1 expects a segment of 131072 bytes, rank 0 made 65536" in seen[1][0], seen
    assert "a peer refused" in seen[0][0] and "131072" in seen[0][0] and seen[0][1] < 5, seen  # not at 20 s


def test_a_segment_left_by_a_killed_creator_is_removed_by_the_next_group(tmp_path):
    """SIGKILL (or torchrun's SIGTERM) while rank 0 waits for its peers to attach leaves the segment's name; the
    next segment made on the host removes it, and only names whose creator is gone from this pid namespace."""
    import subprocess
    import textwrap

    from pt_dist import FileStore
    from pt_dist._infra import shm_segment as segment

    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from pt_dist import FileStore
        from pt_dist._infra import shm_segment as segment
        segment.map_shared_segment(FileStore({str(tmp_path / 'killed')!r}, 1), 0, 2, 1 << 16, "seg", 60, "g")
    """)])
    deadline = time.monotonic() + 60
    while not (left := glob.glob(os.path.join(segment.shm_dir(), f"pt_dist_{child.pid}_*"))):
        assert time.monotonic() < deadline and child.poll() is None, "the child never made its segment"
        time.sleep(0.05)
    child.kill()
    child.wait()
    ns = segment._pid_namespace()
    alive = os.path.join(segment.shm_dir(), f"pt_dist_{os.getpid()}_{'0' * 16}_ns{ns}")  # a live creator's: kept
    elsewhere = os.path.join(segment.shm_dir(), f"pt_dist_{child.pid}_{'1' * 16}_ns1")  # another container's: kept
    for path in (alive, elsewhere):
        open(path, "w").close()
    try:
        segment.map_shared_segment(FileStore(str(tmp_path / "next"), 1), 0, 1, 1 << 16, "seg", 5, "next").close()
        assert not os.path.exists(left[0]) and os.path.exists(alive) and os.path.exists(elsewhere)
    finally:
        os.unlink(alive)
        os.unlink(elsewhere)


def test_a_rank_on_another_host_fails_fast_and_says_why(monkeypatch):
    """A rank that cannot open rank 0's segment (it runs on another host: shm is one host's backend) raises a
    DistError saying so, and rank 0 stops waiting for it at once instead of at the timeout."""
    import threading
    import time

    from pt_dist import DistError, TCPStore
    from pt_dist._infra import shm_segment as segment

    master = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=10)
    stores = [master, TCPStore("127.0.0.1", master.port, 2, is_master=False, timeout=10)]
    real_open = os.open

    def elsewhere(path, flags, *args):  # "rank 1's host" has no such file in its /dev/shm
        if threading.current_thread().name == "rank1" and "pt_dist_" in str(path):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(segment.os, "open", elsewhere)
    seen = {}

    def run(rank):
        t0 = time.monotonic()
        try:
            segment.map_shared_segment(stores[rank], rank, 2, 1 << 16, "seg", 20.0, "far")
        except DistError as e:
            seen[rank] = (str(e), time.monotonic() - t0)

    threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in range(2)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert "needs every rank on one host" in seen[1][0] and "'tcp'" in seen[1][0]
    assert "rank 1 cannot see" in seen[0][0] and seen[0][1] < 5, seen[0]  # not the 20 s timeout


def _collapse_works() -> bool:
    import ctypes

    from pt_dist._infra import huge_pages

    t = torch.ones(4 << 20, dtype=torch.uint8)
    lo = -(-t.data_ptr() // huge_pages.HUGE) * huge_pages.HUGE
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(huge_pages.HUGE), huge_pages.MADV_COLLAPSE) == 0


def test_buffers_used_twice_are_collapsed_into_huge_pages(monkeypatch):
    """The second time a single-copy collective publishes the same range of >= 4 MiB, its whole 2 MiB pages are
    collapsed (peers' process_vm_readv then pins 512x fewer pages); small or new ranges are left alone."""
    from pt_dist._infra import huge_pages

    advisor, big, small = huge_pages.HugePageAdvisor(), torch.ones(3 << 20), torch.ones(1 << 18)
    for _ in range(3):
        advisor.note(big.data_ptr(), big.numel() * 4)
        advisor.note(small.data_ptr(), small.numel() * 4)
    assert advisor.collapsed == (1 if _collapse_works() else 0)
    assert torch.equal(big, torch.ones(3 << 20))  # the backing changed, not the values
    monkeypatch.setenv("PT_DIST_NO_COLLAPSE", "1")
    off = huge_pages.HugePageAdvisor()
    for _ in range(2):
        off.note(big.data_ptr(), big.numel() * 4)
    assert off.collapsed == 0



def test_a_cross_memory_copy_the_kernel_splits_is_finished_and_a_stalled_one_raises():
    """process_vm_readv may move fewer bytes than asked (it stops at a page it cannot pin): the rest is asked
    for again until done; a call that moves nothing raises instead of looping forever."""
    from pt_dist._infra.cma import CrossMemory

    if not _self_read_works():
        pytest.skip("this kernel does not let a process read its own memory with process_vm_readv")
    cma, calls = CrossMemory(), []
    real = cma._readv

    def at_most_a_page(pid, here, n_here, there, n_there, flags):  # the kernel's partial progress, page by page
        cma._here.iov_len = cma._there.iov_len = min(cma._here.iov_len, 4096)  # the structs behind here/there
        calls.append(cma._here.iov_len)
        return real(pid, here, n_here, there, n_there, flags)

    cma._readv = at_most_a_page
    src, dst = torch.arange(2500.0), torch.zeros(2500)  # 10000 bytes: 4096 + 4096 + 1808
    cma.read(os.getpid(), src.data_ptr(), dst.data_ptr(), 10000)
    assert torch.equal(src, dst) and calls == [4096, 4096, 1808]
    cma._readv = lambda *_: 0
    with pytest.raises(OSError, match="process_vm_readv"):
        cma.read(os.getpid(), src.data_ptr(), dst.data_ptr(), 16)


def _late_peer(rank, world_size):
    util.join(rank, world_size, "shm", key="late")
    group = pt_dist.GroupMember.WORLD
    yields, real = [], os.sched_yield
    os.sched_yield = lambda: yields.append(1) or real()
    try:
        pt_dist.barrier()
        if rank == 1:
            time.sleep(0.02)  # inside rank 0's 2 ms spin and past it: rank 0 spins, then sleeps on the futex
        t0 = time.monotonic()
        group.counters.arrive_and_wait("test")
        waited = time.monotonic() - t0
    finally:
        os.sched_yield = real
    util.leave()
    return len(yields), waited


def test_a_spinning_waiter_yields_its_core_between_polls():
    """Issue 34, defect 0: with a third runnable task on the cores (any other process), a waiter that spins
    without yielding lets the scheduler preempt the very peer it waits for, and small collectives then took a
    time slice (~2 ms) each. The spin yields between polls whether or not the ranks outnumber the cores (with
    2 ranks on 2 cores it did not yield at all)."""
    (yields0, waited0), _ = run_ranks(_late_peer, 2, timeout=60, backend=None)
    assert yields0 > 0
    assert waited0 < 1.0  # woken by the peer's arrival, not by a timeout
