"""DeviceMesh over pt_dist groups, after torch's test/distributed/test_device_mesh.py (DeviceMeshTest,
DeviceMeshTestNDim, InitDeviceMeshTest, TestDeviceMeshGetItem): in the same ranks, torch's ``init_device_mesh``
on a gloo group and ours on a pt_dist world (tcp, shm, and pt_dist's gloo adapter) give the same mesh tensor,
the same group members per mesh dim, local ranks, coordinates, sub-meshes by name and repr; a 2x2 mesh on 4
ranks; bad input named before any group is made."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed as dist

import harness
from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import error_recorder, join, leave  # noqa: E402


def _both_worlds(rank, world, backend):
    """torch's default group on gloo first (so pt_dist's world does not become torch's), then pt_dist's; pt_dist's
    gloo adapter makes torch's default group itself, and torch's side then runs on that one."""
    if backend == "gloo":
        join(rank, world, backend, timeout=60, key="dm_pt")
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        return
    if rank == 0:
        tstore = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=60))
        harness.store().set("dm_port", str(tstore.port))
    else:
        tstore = dist.TCPStore("127.0.0.1", int(harness.store().get("dm_port")), world,
                               timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=tstore, rank=rank, world_size=world)
    join(rank, world, backend, timeout=60, key="dm_pt")


def _describe(mesh, ranks_of, local_rank_of):
    dims = range(mesh.ndim)
    return {"mesh": mesh.mesh.tolist(), "shape": tuple(mesh.shape), "ndim": mesh.ndim, "size": mesh.size(),
            "names": mesh.mesh_dim_names, "coord": mesh.get_coordinate(), "repr": repr(mesh),
            "groups": [ranks_of(mesh.get_group(d)) for d in dims],
            "local": [local_rank_of(mesh, d) for d in dims], "device_type": mesh.device_type}


def _mesh_parity(rank, world, backend, shape, names):
    from pt_dist.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    _both_worlds(rank, world, backend)
    try:
        ours, theirs = init_device_mesh("cpu", shape, mesh_dim_names=names), torch_init("cpu", shape,
                                                                                         mesh_dim_names=names)
        got = [_describe(ours, pt_dist.get_process_group_ranks, lambda m, d: m.get_local_rank(d))]
        want = [_describe(theirs, dist.get_process_group_ranks, lambda m, d: m.get_local_rank(d))]
        for sub in ([names[0]], [names[-1]], list(names)) if len(names) > 1 else ():
            key = sub[0] if len(sub) == 1 else tuple(sub)
            got.append(_describe(ours[key], pt_dist.get_process_group_ranks, lambda m, d: m.get_local_rank(d)))
            want.append(_describe(theirs[key], dist.get_process_group_ranks, lambda m, d: m.get_local_rank(d)))
        # the groups work: an all-reduce over each mesh dim's group sums that slice's ranks
        sums = []
        for d in range(ours.ndim):
            t = torch.tensor([float(rank)])
            pt_dist.all_reduce(t, group=ours.get_group(d))
            sums.append(t.item())
        want_sums = [float(sum(g)) for g in want[0]["groups"]]
        explicit = DeviceMesh("cpu", torch.arange(world).view(shape), mesh_dim_names=names)
        same = explicit == ours and hash(explicit) == hash(ours)
        with ours as current:
            from pt_dist.device_mesh import _mesh_resources

            entered = _mesh_resources.get_current_mesh() is current
        if len(names) > 1:  # a sub-mesh keeps the root's dim order (torch's KeyError, its words)
            try:
                ours[tuple(reversed(names))]
                order = None
            except KeyError as e:
                order = str(e)
            try:
                theirs[tuple(reversed(names))]
            except KeyError as e:
                same = same and order == str(e)
        return got, want, sums, want_sums, same, entered
    finally:
        leave()
        if dist.is_initialized():
            dist.destroy_process_group()


# first: the pool of 4 ranks it starts then serves the 2-rank cases too (one start, not two)
def test_2x2_mesh_and_sub_meshes_match_torchs_on_4_ranks():
    results = run_ranks(_mesh_parity, 4, "tcp", (2, 2), ("dp", "tp"), backend=None, timeout=120)
    for rank, (got, want, sums, want_sums, same, entered) in enumerate(results):
        assert got == want, rank
        assert got[0]["groups"] == [[rank % 2, rank % 2 + 2], [rank // 2 * 2, rank // 2 * 2 + 1]]  # (dp, tp)
        assert got[1]["mesh"] == [rank % 2, rank % 2 + 2] and got[3]["shape"] == (2, 2)
        assert sums == want_sums
        assert same and entered


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_1d_mesh_matches_torchs(backend):
    for got, want, sums, want_sums, same, entered in run_ranks(_mesh_parity, 2, backend, (2,), ("dp",),
                                                               backend=None, timeout=120):
        assert got == want
        assert sums == want_sums == [1.0]
        assert same and entered


def _bad_input(rank, world):
    from pt_dist.device_mesh import DeviceMesh, init_device_mesh

    join(rank, world, "tcp", timeout=30, key="dm_bad")
    errors = {}
    record = error_recorder(errors)

    try:
        before = pt_dist.get_pg_count()
        record("too_big", lambda: init_device_mesh("cpu", (4,)))
        record("names_len", lambda: init_device_mesh("cpu", (2,), mesh_dim_names=("a", "b")))
        record("names_repeat", lambda: init_device_mesh("cpu", (1, 2), mesh_dim_names=("a", "a")))
        record("indexed_device", lambda: init_device_mesh("cuda:0", (2,)))
        record("outside", lambda: DeviceMesh("cpu", [0, 5]))
        made = pt_dist.get_pg_count() - before
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
        record("unknown_name", lambda: mesh["pp"])
        record("dim_range", lambda: mesh.get_group(2))
        record("no_dim", lambda: mesh.get_group())
        record("no_names", lambda: init_device_mesh("cpu", (2,))["dp"])
        return errors, made
    finally:
        leave()


def test_bad_input_is_named():
    errors, made = run_ranks(_bad_input, 2, backend=None, timeout=60)[0]
    assert made == 0  # refused before any group was made
    assert errors["too_big"][0] == "RuntimeError" and "world size 2" in errors["too_big"][1] \
        and "4 ranks" in errors["too_big"][1]
    assert errors["names_len"][0] == "RuntimeError" and "len(mesh_dim_names): 2" in errors["names_len"][1]
    assert errors["names_repeat"][0] == "RuntimeError" and "('a', 'a')" in errors["names_repeat"][1]
    assert errors["indexed_device"][0] == "RuntimeError" and "cuda:0" in errors["indexed_device"][1]
    assert errors["outside"][0] == "RuntimeError" and "[0, 5]" in errors["outside"][1]
    assert errors["unknown_name"][0] == "KeyError" and "'pp'" in errors["unknown_name"][1] \
        and "('dp', 'tp')" in errors["unknown_name"][1]
    assert errors["dim_range"][0] == "IndexError" and "mesh_dim=2" in errors["dim_range"][1]
    assert errors["no_dim"][0] == "RuntimeError" and "2 dimensions" in errors["no_dim"][1]
    assert errors["no_names"] == ("RuntimeError", "Cannot slice a DeviceMesh without mesh_dim_names!")
