"""Making groups: new_group called in different orders, new_group with use_local_synchronization, torch's
new_subgroups / new_subgroups_by_enumeration, and split_group, on the native backends and the gloo adapter."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError, GroupMember

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _misordered(rank, ws, backend):
    import harness

    util.join(rank, ws, backend, key=f"misordered-{backend}")  # the default timeout: gloo's init may be slow
    order = {0: [[0, 1], [1, 2]], 1: [[1, 2], [0, 1]], 2: [[0, 1], [1, 2]]}[rank]
    got = None
    try:
        for ranks in order:
            pt_dist.new_group(ranks, timeout=3)
    except DistError as e:
        got = str(e)
    hs = harness.store()  # rank 2 gives up on the second group last
    hs.add(f"misordered-{backend}", 1)
    while hs.add(f"misordered-{backend}", 0) < ws:
        time.sleep(0.01)
    t = torch.ones(1)
    pt_dist.all_reduce(t)  # the default group is untouched
    util.leave()
    return got, t.item()


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_new_group_called_in_different_orders_says_so(backend):
    """Ranks that create the same groups in different orders used to meet the wrong peers in one store namespace
    and time out on a mesh or store key, with a hint about loopback addresses; now members compare the rank lists."""
    got = run_ranks(_misordered, 3, backend, backend=None, timeout=60)
    assert [g[1] for g in got] == [3.0] * 3
    assert "the call that makes 'group1' is ranks [0, 1] on rank 0 but [1,2] on rank 1" in got[0][0], got
    # rank 2 is not in its first group [0, 1], so it posts nothing there: rank 1 learns only that it never came
    assert "rank(s) [2] did not create 'group1' (ranks [1, 2]) within 3.0s" in got[1][0], got
    assert "rank(s) [1] did not create 'group2' (ranks [1, 2]) within 3.0s" in got[2][0], got


def _local_sync(rank, ws, backend):
    util.join(rank, ws, backend, key=f"localsync-{backend}")
    got = {}

    def every():  # the usual kind, which every rank creates
        t = torch.ones(1)
        pt_dist.all_reduce(t, group=pt_dist.new_group())
        got["every"] = t.item()

    if backend == "gloo":  # torch 2.15 counts local-sync groups on their members only: create them last there
        every()
    if rank in (0, 1):  # rank 2 never calls: Megatron builds its many groups this way
        pair = pt_dist.new_group([1, 0], use_local_synchronization=True, group_desc="pair")
        t = torch.full((2,), rank + 1.0)
        pt_dist.all_reduce(t, group=pair)
        got["pair"] = (t.tolist(), pair.group_desc, pt_dist.get_process_group_ranks(pair))
    if backend != "gloo":  # ours names them apart: all ranks still agree on the next group's name
        every()
    util.leave()
    return got


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_new_group_with_local_synchronization_is_called_by_members_only(backend):
    res = run_ranks(_local_sync, 3, backend, backend=None, timeout=90)
    assert [r["every"] for r in res] == [3.0] * 3
    assert res[0]["pair"] == res[1]["pair"] == ([3.0, 3.0], "pair", [0, 1]) and "pair" not in res[2]


def _subgroups(rank, ws, backend):
    util.join(rank, ws, backend, key=f"subgroups-{backend}")
    with pytest.raises(ValueError, match="rank 2 is in both \\[0, 2\\] and \\[2, 3\\]"):
        pt_dist.new_subgroups_by_enumeration([[0, 2], [2, 3]])  # refused before any group is made
    with pytest.raises(ValueError, match="group_size=3 must be a positive divisor of the group's size 4"):
        pt_dist.new_subgroups(3)
    sums = []
    for mine, groups in (pt_dist.new_subgroups(2), pt_dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])):
        t = torch.tensor([float(rank)])
        pt_dist.all_reduce(t, group=mine)
        sums.append((t.item(), len(groups)))
    util.leave()
    return sums


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_new_subgroups_cut_the_world_into_groups(backend):
    assert run_ranks(_subgroups, 4, backend, backend=None, timeout=90) == [
        [(1.0, 2), (2.0, 2)], [(1.0, 2), (4.0, 2)], [(5.0, 2), (2.0, 2)], [(5.0, 2), (4.0, 2)]]


def _split(rank, ws, backend):
    util.join(rank, ws, backend, key=f"split-{backend}", timeout=30)  # (torch's split: a store connect, slow loaded)
    try:
        bad = {"[]": [], "[[0, 0]]": [[0, 0]], "[[0], [0, 1]]": [[0], [0, 1]], "[[4]]": [[4]], "[[]]": [[]]}
        errors = {}
        for text, lists in bad.items():  # refused before anything is created or sent
            with pytest.raises(ValueError, match="split_group: ") as e:
                pt_dist.split_group(split_ranks=lists)
            errors[text] = str(e.value)
        with pytest.raises(ValueError, match="differs from the parent group's"):
            pt_dist.split_group(split_ranks=[[0]], backend="tcp" if backend != "tcp" else "shm")
        assert pt_dist.get_pg_count() == 1
        g = pt_dist.split_group(split_ranks=[[3, 1], [0, 2]])  # a list's order is its ranks' order
        got = {"rank": pt_dist.get_rank(g), "ranks": pt_dist.get_process_group_ranks(g)}
        t = torch.tensor([float(rank + 1)])
        pt_dist.all_reduce(t, group=g)
        b = torch.tensor([float(rank)])
        pt_dist.broadcast(b, group=g, group_src=0)
        got.update(sum=t.item(), bcast=b.item())
        g2 = pt_dist.split_group(g, [[1]])  # a split of a split: ranks are the parent's own
        got["g2"] = None if g2 is GroupMember.NON_GROUP_MEMBER else pt_dist.get_process_group_ranks(g2)
        got["count"] = pt_dist.get_pg_count()
        try:
            pt_dist.split_group(split_ranks=[[0, 2], [1, 3]] if rank == 2 else [[0, 1], [2, 3]])
        except DistError as e:
            got["disagree"] = str(e)
        t = torch.ones(1)
        pt_dist.all_reduce(t)  # the default group is untouched
        got["after"] = t.item()
        return got, errors
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_split_group_cuts_the_parent_into_ordered_children(backend):
    got = run_ranks(_split, 4, backend, backend=None, timeout=120)
    child = {0: (0, [0, 2]), 1: (1, [3, 1]), 2: (1, [0, 2]), 3: (0, [3, 1])}
    for rank, (g, errors) in enumerate(got):
        assert (g["rank"], g["ranks"]) == child[rank], (rank, g)
        assert g["sum"] == (4.0 if rank in (0, 2) else 6.0) and g["bcast"] == (0.0 if rank in (0, 2) else 3.0)
        assert g["g2"] == {1: [1], 2: [2]}.get(rank), (rank, g)
        assert g["count"] == 3 and g["after"] == 4.0
        assert "the call that makes 'default_pg:split2' is [[0, 1], [2, 3]] on rank" in g["disagree"] or \
            "is [[0, 2], [1, 3]] on rank 2 but [[0, 1], [2, 3]]" in g["disagree"], g["disagree"]
        assert "rank 0 is in split_ranks[0] and [1]" in errors["[[0], [0, 1]]"]
        assert "rank 4 in split_ranks[0] is not a rank of the parent group (size 4)" in errors["[[4]]"]
        assert "rank 0 is twice in split_ranks[0]" in errors["[[0, 0]]"]


def _late_non_member(rank, ws):
    util.join(rank, ws, "tcp", key="late-non-member")
    store = pt_dist.distributed_c10d._world.store
    while hasattr(store, "underlying_store"):  # (the world's prefix on the TCPStore)
        store = store.underlying_store
    if rank == 2:
        time.sleep(1.0)  # busy elsewhere: the members are done and rank 0's store is gone by the time it calls
    sub = pt_dist.new_group([0, 1])
    if rank != 2:
        pt_dist.all_reduce(torch.ones(2), group=sub)
    pt_dist.destroy_process_group()
    if rank == 0:
        store.close()  # as when rank 0 hosts the store of its own init: its destroy takes the store down
    return sub is pt_dist.GroupMember.NON_GROUP_MEMBER


def test_a_rank_outside_a_new_group_does_not_need_the_store():
    """Non-members posted their call to the store, though only members read them: one coming late, after rank 0 had
    destroyed its groups, failed (DistNetworkError: the store closed), seen under load in CI's two-host test."""
    assert run_ranks(_late_non_member, 3, backend=None, timeout=60) == [False, False, True]


# The DeviceMesh recipe's first block (pytorch/tutorials recipes_source/distributed_device_mesh.rst), CPU lines:
# "gloo" for "nccl", no torch.cuda.set_device, the world size for torch.cuda.device_count(). Rank 0 belongs to no
# group after the shard groups and exits first, while ranks 1 and 3 still build the replicate group [1, 3].
DEVICE_MESH_RECIPE = """
import os
import torch
import {lib} as dist

rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")
num_node_devices = world_size
shard_rank_lists = list(range(0, num_node_devices // 2)), list(range(num_node_devices // 2, num_node_devices))
shard_groups = (
    dist.new_group(shard_rank_lists[0]),
    dist.new_group(shard_rank_lists[1]),
)
current_shard_group = (
    shard_groups[0] if rank in shard_rank_lists[0] else shard_groups[1]
)
current_replicate_group = None
shard_factor = len(shard_rank_lists[0])
for i in range(num_node_devices // 2):
    replicate_group_ranks = list(range(i, num_node_devices, shard_factor))
    replicate_group = dist.new_group(replicate_group_ranks)
    if rank in replicate_group_ranks:
        current_replicate_group = replicate_group
"""

# As torchrun runs it: an agent hosts torch's TCPStore (MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE) and the 4 ranks
# run the recipe as processes of their own that exit, ``runs`` times, a fresh agent store each time. The launcher
# imports torch and the library once and forks each rank from itself (a fresh interpreter per rank costs seconds of
# imports, 40 of them here); a rank runs the recipe as ``__main__`` and exits the way an interpreter does, atexit
# handlers included. The agent's store lives in a process of its own: the launcher forks, so it holds no threads.
LAUNCHER = """
import importlib, os, runpy, subprocess, sys, time, traceback

script, runs, lib = sys.argv[1], int(sys.argv[2]), sys.argv[3]
importlib.import_module(lib)
AGENT = (
    "import datetime, sys, torch.distributed as tdist\\n"
    "for _ in sys.stdin:\\n"
    "    store = None\\n"
    "    store = tdist.TCPStore('127.0.0.1', 0, 5, is_master=True, wait_for_workers=False,\\n"
    "                           timeout=datetime.timedelta(seconds=60))\\n"
    "    print(store.port, flush=True)\\n")
agent = subprocess.Popen([sys.executable, "-c", AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
codes, errors = [], []
for run in range(runs):
    agent.stdin.write("\\n")
    agent.stdin.flush()
    env = dict(os.environ, WORLD_SIZE="4", LOCAL_WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=agent.stdout.readline().strip(), TORCHELASTIC_USE_AGENT_STORE="True",
               TORCHELASTIC_RESTART_COUNT="0")
    pids = []
    for r in range(4):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the rank: stderr to its log, its environment, the recipe, then an interpreter's exit
            os.dup2(os.open(f"{script}.{run}.{r}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            os.environ.clear()
            os.environ.update(env, RANK=str(r), LOCAL_RANK=str(r))
            sys.argv = [script]
            try:
                runpy.run_path(script, run_name="__main__")
            except BaseException:
                traceback.print_exc()
                sys.exit(1)
            sys.exit(0)
        pids.append(pid)
    status, deadline = {}, time.monotonic() + 240
    while len(status) < 4:
        for pid in pids:
            if pid not in status:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    status[pid] = os.waitstatus_to_exitcode(code)
        if time.monotonic() > deadline or any(status.values()):  # as torchrun: one failed, stop the rest
            for pid in pids:
                if pid not in status:
                    os.kill(pid, 9)
        time.sleep(0.05)
    codes.append([status[pid] for pid in pids])
    for r, pid in enumerate(pids):
        lines = open(f"{script}.{run}.{r}.err").read().strip().splitlines()
        if status[pid] and lines:
            errors.append(lines[-1])
agent.stdin.close()
agent.wait()
print(errors, file=sys.stderr)
print(codes)
"""


@pytest.mark.parametrize(("lib", "runs"), [("torch.distributed", 2), ("pt_dist", 10)])
def test_device_mesh_recipe_layout_survives_rank_0_exiting_first_10_times(tmp_path, lib, runs):
    """Defect: under torchrun, pt_dist's store lived in rank 0, which exits first here, so ranks 1 and 3 failed
    building [1, 3] ("connection to the store failed"; torch's store is the agent's, which outlives them). Now a
    process hosting a store serves it at exit until the other processes have closed their connections."""
    import json
    import os
    import subprocess

    (tmp_path / "recipe.py").write_text(DEVICE_MESH_RECIPE.format(lib=lib))
    (tmp_path / "launch.py").write_text(LAUNCHER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "recipe.py"), str(runs), lib],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert codes == [[0, 0, 0, 0]] * runs, (codes, proc.stderr[-3000:])
