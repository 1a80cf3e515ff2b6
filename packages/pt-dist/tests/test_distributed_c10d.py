"""Process-group management: init_process_group over env://, tcp:// and file://, sub-groups, module API, errors."""

from __future__ import annotations

import datetime
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import pt_dist
import pytest
import torch
from pt_dist import DistError, GroupMember, ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402


def _subgroups(rank, world_size, backend, env_port, tcp_port, file_path):
    out = {}
    os.environ["MASTER_PORT"] = str(env_port)  # RANK, WORLD_SIZE, MASTER_ADDR come from the launcher (harness)
    try:
        pt_dist.init_process_group(backend, timeout=30)  # env:// by default, as torchrun users write it
    finally:
        del os.environ["MASTER_PORT"]
    out["world"] = (pt_dist.get_rank(), pt_dist.get_world_size(), pt_dist.get_backend())
    odd = pt_dist.new_group([1, 3])
    rest = pt_dist.new_group([0, 2, 3], backend="shm" if backend == "tcp" else "tcp")
    if odd is GroupMember.NON_GROUP_MEMBER:
        out["odd"] = (pt_dist.get_rank(odd), pt_dist.all_reduce(torch.ones(1), group=odd))
    else:
        t = torch.tensor([float(rank)])
        pt_dist.all_reduce(t, group=odd)
        b = torch.tensor([float(rank)])
        pt_dist.broadcast(b, src=3, group=odd)  # src is a global rank
        out["odd"] = (pt_dist.get_rank(odd), pt_dist.get_world_size(odd), t.item(), b.item(),
                      pt_dist.get_global_rank(odd, 0), pt_dist.get_process_group_ranks(odd))
    if rest is not GroupMember.NON_GROUP_MEMBER:
        t = torch.tensor([float(rank)])
        pt_dist.all_reduce(t, op=ReduceOp.MAX, group=rest)
        out["rest"] = (pt_dist.get_rank(rest), pt_dist.get_backend(rest), t.item())
        pt_dist.destroy_process_group(rest)
    pt_dist.barrier()
    pt_dist.destroy_process_group()
    assert not pt_dist.is_initialized()
    # three inits in a row on one port and on one file: none may reach the last one's store server (a fast rank
    # once did, before rank 0 had closed it) or read its keys from the file (they once did)
    for url in (*[f"tcp://127.0.0.1:{tcp_port}"] * 3, *[f"file://{file_path}"] * 3):
        pt_dist.init_process_group(backend, init_method=url, rank=rank, world_size=world_size, timeout=30)
        t = torch.ones(3)
        pt_dist.all_reduce(t)
        out.setdefault(url.split(":")[0], []).append(t.tolist())
        pt_dist.barrier()
        pt_dist.destroy_process_group()
    return out


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_init_methods_and_subgroups(backend, tmp_path):
    res = run_ranks(_subgroups, 4, backend, util.free_port(), util.free_port(), str(tmp_path / "rdzv"),
                    backend=None, timeout=120)
    for r, out in enumerate(res):
        assert out["world"] == (r, 4, backend)
        assert out["tcp"] == out["file"] == [[4.0] * 3] * 3
    assert not (tmp_path / "rdzv").exists()  # removed by its last user, as c10d's FileStore does
    assert res[0]["odd"] == (-1, None) and res[2]["odd"] == (-1, None)
    assert res[1]["odd"] == (0, 2, 4.0, 3.0, 1, [1, 3]) and res[3]["odd"] == (1, 2, 4.0, 3.0, 1, [1, 3])
    other = "shm" if backend == "tcp" else "tcp"
    assert [res[r]["rest"] for r in (0, 2, 3)] == [(0, other, 3.0), (1, other, 3.0), (2, other, 3.0)]
    assert "rest" not in res[1]


def _reinit_same_port(rank, world_size, port):
    """Rank 0 (the store's master) lingers before destroying; the others destroy at once and init again on the
    same port. They must not reach the old store server, which is about to vanish."""
    sums = []
    for _ in range(2):
        pt_dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                   timeout=20)
        t = torch.ones(2)
        pt_dist.all_reduce(t)
        sums.append(t[0].item())
        pt_dist.barrier()
        if rank == 0:
            time.sleep(1.0)
        # the first time as group.WORLD, which torch treats as the default: everything goes (it once left the
        # default group set, shut down, and the next init refused)
        pt_dist.destroy_process_group(pt_dist.group.WORLD if len(sums) == 1 else None)
        assert not pt_dist.is_initialized()
    return sums


def test_destroy_then_init_on_the_same_port_while_the_master_lingers():
    assert run_ranks(_reinit_same_port, 3, util.free_port(), backend=None, timeout=120) == [[3.0, 3.0]] * 3


def _init_and_forget(rank, world_size, port):
    pt_dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                               timeout=20)
    return pt_dist.is_initialized()  # and no destroy_process_group


def _init_fresh(rank, world_size, port):
    assert not pt_dist.is_initialized()
    pt_dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                               timeout=20)
    t = torch.ones(1)
    pt_dist.all_reduce(t)
    util.leave()
    return t.item()


def test_a_group_a_test_leaves_up_does_not_fail_the_next_one_on_the_pooled_ranks():
    """The harness destroyed only torch.distributed's default group after a job; pt_dist's stayed up in the
    pooled ranks, and the next test's init failed ("already initialized"), blamed on the wrong test."""
    assert run_ranks(_init_and_forget, 2, util.free_port(), backend=None) == [True, True]
    assert run_ranks(_init_fresh, 2, util.free_port(), backend=None) == [2.0, 2.0]


def test_bad_arguments_raise_before_any_communication(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend 'carrier-pigeon'"):
        pt_dist.init_process_group("carrier-pigeon", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)
    with pytest.raises(ValueError, match="rank 5 is outside world_size 2"):
        pt_dist.init_process_group("tcp", init_method="tcp://127.0.0.1:1", rank=5, world_size=2)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="MASTER_PORT"):
        pt_dist.init_process_group("tcp", rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="^No rendezvous handler for udp://"):  # torch's class and words
        pt_dist.init_process_group("tcp", init_method="udp://x:1", rank=0, world_size=1)
    with pytest.raises(ValueError, match="not initialized"):
        pt_dist.all_reduce(torch.ones(1))
    # torch's device_id / pg_options are for its own groups; the native backends refuse them by name
    with pytest.raises(ValueError, match=r"backend 'tcp' moves CPU tensors; device_id=cuda:1 needs 'nccl'"):
        pt_dist.init_process_group("tcp", init_method="tcp://127.0.0.1:1", rank=0, world_size=2, device_id=1)
    with pytest.raises(ValueError, match="backend 'shm' takes no pg_options"):
        pt_dist.init_process_group("shm", init_method="tcp://127.0.0.1:1", rank=0, world_size=2, pg_options=object())
    with pytest.raises(ValueError, match=r"device_id=cpu needs an index for torch's groups \(cpu:0"):
        pt_dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=2,
                                   device_id=torch.device("cpu"))
    with pytest.raises(ValueError, match="device_id must be a torch.device or an int"):
        pt_dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=2, device_id="cpu")
    assert not pt_dist.is_initialized()
    assert pt_dist.is_available()
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert pt_dist.get_node_local_rank(fallback_rank=3) == 3
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not in the environment"):
        pt_dist.get_node_local_rank()
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert pt_dist.get_node_local_rank(fallback_rank=3) == 1


def test_invalid_collective_arguments_fail_locally():
    pt_dist.init_process_group("tcp", init_method=f"tcp://127.0.0.1:{util.free_port()}", rank=0, world_size=1,
                               timeout=5)
    try:
        with pytest.raises(ValueError, match="a 'gloo' sub-group needs a torch-backed default group"):
            pt_dist.new_group([0], backend="gloo")
        assert pt_dist.new_group([0]).group_name == "group1"  # the refused call took no group id (no store traffic)
        with pytest.raises(ValueError, match="global rank 3 is not part of group"):
            pt_dist.broadcast(torch.ones(1), src=3)
        with pytest.raises(ValueError, match="src=3 is not a rank"):
            GroupMember.WORLD.broadcast(torch.ones(1), src=3)
        with pytest.raises(TypeError, match="must be an int rank, got 0.0"):  # torch refuses it too
            pt_dist.broadcast(torch.ones(1), src=0.0)
        with pytest.raises(ValueError, match="group rank -1 is not part of group"):  # not the last rank, silently
            pt_dist.get_global_rank(None, -1)
        with pytest.raises(ValueError, match="AVG needs a floating"):
            pt_dist.all_reduce(torch.ones(2, dtype=torch.int64), op=ReduceOp.AVG)
        for dtype in (torch.float8_e4m3fn, torch.uint16):  # torch has no CPU add for them: refuse before sending
            with pytest.raises(ValueError, match=f"cannot compute ReduceOp.SUM on {dtype}"):
                pt_dist.all_reduce(torch.ones(2).to(dtype))
        # float8 multiplies pairs but not a lone element, which any slice may be: refused, as gloo does
        with pytest.raises(ValueError, match="cannot compute ReduceOp.PRODUCT on torch.float8_e5m2"):
            pt_dist.all_reduce(torch.ones(4).to(torch.float8_e5m2), op=ReduceOp.PRODUCT)
        with pytest.raises(ValueError, match="share memory .expanded"):  # would fail half-way when written
            pt_dist.all_reduce(torch.ones(1).expand(4))
        pt_dist.all_gather_into_tensor(torch.empty(4), torch.ones(1).expand(4))  # an expanded input is only read
        moved = torch.arange(4.0).to(torch.float8_e4m3fn)
        pt_dist.broadcast(moved, src=0)  # moving their bytes is fine
        assert moved.float().tolist() == [0.0, 1.0, 2.0, 3.0]
        with pytest.raises(ValueError, match="must hold world_size=1"):
            pt_dist.all_gather_into_tensor(torch.empty(3), torch.empty(2))
        buf = torch.arange(5.0)  # overlapping, but not as the in-place form: the input is read as it was
        pt_dist.all_gather_into_tensor(buf[0:4], buf[1:5])
        assert buf.tolist() == [1.0, 2.0, 3.0, 4.0, 4.0]
        pt_dist.reduce_scatter_tensor(buf[1:5], buf[0:4])
        assert buf.tolist() == [1.0, 1.0, 2.0, 3.0, 4.0]
        pt_dist.all_gather_into_tensor(buf[0:4], buf[0:4])  # the in-place form itself is fine
        with pytest.raises(ValueError, match="all-to-all cannot run in place"):
            pt_dist.all_to_all_single(buf[0:4], buf[0:4])
        with pytest.raises(ValueError, match="input_split_sizes"):
            pt_dist.all_to_all_single(torch.empty(2), torch.empty(2), [2], [3])
        with pytest.raises(ValueError, match="new_group"):
            pt_dist.new_group([0, 7])
        for bad in (-5, datetime.timedelta(seconds=-5), 0):  # torch: "Invalid timeout"; no rank may go on to meet
            with pytest.raises(ValueError, match=f"new_group: timeout must be positive, got {re.escape(repr(bad))}"):
                pt_dist.new_group([0], timeout=bad)
            with pytest.raises(ValueError, match="split_group: timeout must be positive"):
                pt_dist.split_group(split_ranks=[[0]], timeout=bad)
        assert pt_dist.new_group([0]).group_name == "group2"  # the refused calls took no group id
        with pytest.raises(TypeError, match=r"split_sizes must be a list of ints, got \[1.9\]"):  # not cut to 1
            pt_dist.all_to_all_single(torch.empty(1), torch.empty(1), [1.9], [1])
        for call, peer in ((pt_dist.broadcast, "src"), (pt_dist.reduce, "dst")):  # torch 2.15 names no default
            with pytest.raises(ValueError, match=f"name the peer: {peer}="):
                call(torch.ones(1))
        pt_dist.broadcast(torch.ones(1), group_src=np.int64(0))  # a numpy int is a rank, as for src=
        t = torch.arange(4.0)
        pt_dist.all_reduce(t)  # a world of one is the identity
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        pt_dist.destroy_process_group()


def test_register_backend_plugs_a_new_name_into_init_process_group():
    from pt_dist import Backend
    from pt_dist.backends.tcp import ProcessGroupTCP

    made = []

    def create(store, rank, size, timeout, group_name, secret, global_ranks):
        made.append((rank, size, group_name))
        return ProcessGroupTCP(store, rank, size, timeout, group_name, secret)

    Backend.register_backend("ring-plugin", create)
    try:
        pt_dist.init_process_group("ring-plugin", init_method=f"tcp://127.0.0.1:{util.free_port()}", rank=0,
                                   world_size=1, timeout=5)
        t = torch.ones(2)
        pt_dist.all_reduce(t)
        assert made == [(0, 1, "default_pg")] and t.tolist() == [1.0, 1.0]
        pt_dist.destroy_process_group()
    finally:
        Backend._plugins.pop("ring-plugin")
    with pytest.raises(ValueError, match="unknown backend 'ring-plugin'"):
        Backend("ring-plugin")


def _ipv6(rank, world_size, backend, port):
    os.environ["PT_DIST_LISTEN_ADDR"] = "::1"  # the backends' sockets too, not only the store
    try:
        pt_dist.init_process_group(backend, init_method=f"tcp://[::1]:{port}", rank=rank, world_size=world_size,
                                   timeout=20)
        t = torch.full((3,), float(rank + 1))
        pt_dist.all_reduce(t)
        got = torch.zeros(2)
        if rank == 0:
            pt_dist.send(torch.full((2,), 7.0), dst=1)
        else:
            pt_dist.recv(got, src=0)
        pt_dist.barrier()
        pt_dist.destroy_process_group()
        return t.tolist(), got.tolist()
    finally:
        del os.environ["PT_DIST_LISTEN_ADDR"]


def _ipv6_loopback() -> bool:
    import socket

    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_ipv6_rendezvous_and_backend_sockets(backend):
    """c10d takes IPv6 addresses (tcp://[::1]:port, MASTER_ADDR=::1): so do our store and backend listeners."""
    res = run_ranks(_ipv6, 2, backend, util.free_port(), backend=None, timeout=60)
    assert res == [([3.0] * 3, [0.0, 0.0]), ([3.0] * 3, [7.0, 7.0])]


def test_a_failed_init_frees_its_port_for_the_retry():
    """The first init fails (rank 1 joins the store but never builds its group); a retry on the same port must get
    the port back (the failed init once kept its store server listening: 'address already in use')."""
    import threading

    from pt_dist import TCPStore
    from pt_dist._infra.store import PrefixStore
    from pt_dist.backends.tcp import ProcessGroupTCP

    port = util.free_port()
    peer = {}

    def rank1(build: bool):
        store = TCPStore("127.0.0.1", port, 2, timeout=10)  # the secret rank 0's store published for this user
        if build:
            mesh_secret = store.get("pt_dist/mesh_secret")
            peer["pg"] = ProcessGroupTCP(PrefixStore("default_pg", store), 1, 2, 10.0, "default_pg", mesh_secret)
            t = torch.full((2,), 5.0)
            peer["pg"].all_reduce(t)
            peer["sum"] = t.tolist()
        else:
            time.sleep(3)  # joined, never builds its group

    url = f"tcp://127.0.0.1:{port}"
    first = threading.Thread(target=rank1, args=(False,))
    first.start()
    with pytest.raises(DistError, match="mesh setup timed out"):
        pt_dist.init_process_group("tcp", init_method=url, rank=0, world_size=2, timeout=1.5)
    first.join()
    second = threading.Thread(target=rank1, args=(True,))
    second.start()
    pt_dist.init_process_group("tcp", init_method=url, rank=0, world_size=2, timeout=10)
    t = torch.full((2,), 1.0)
    pt_dist.all_reduce(t)
    second.join(10)
    assert t.tolist() == peer["sum"] == [6.0, 6.0]
    peer["pg"].shutdown()
    pt_dist.destroy_process_group()


def _monitored(rank, ws, backend):
    # device_id=cpu:0 is accepted everywhere (and handed to torch's own group under gloo)
    util.join(rank, ws, backend, key=f"monitored-{backend}", device_id=torch.device("cpu", 0))
    try:
        pt_dist.monitored_barrier(timeout=10)
        pt_dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
        results = {}
        store = pt_dist.distributed_c10d._world.store
        pt_dist.barrier()
        keys = store.num_keys()
        pt_dist.barrier()
        for _ in range(5):
            pt_dist.monitored_barrier(timeout=datetime.timedelta.max)  # "no timeout" (overflowed the waits)
        pt_dist.barrier()
        results["new keys"] = store.num_keys() - keys  # each call once left world size + 1 keys for good
        pt_dist.barrier()
        # rank 2 is stuck elsewhere (alive, not calling): the others name it, within the timeout
        if rank != 2:
            start = time.monotonic()
            with pytest.raises(DistError, match=r"rank\(s\) \[2\] \(the first found"):
                pt_dist.monitored_barrier(timeout=0.5)
            results["took"] = time.monotonic() - start
        # only rank 0 arrives: with wait_all_ranks it names everyone missing
        if rank == 0:
            with pytest.raises(DistError, match=r"rank\(s\) \[1, 2\] did not reach it within 0.5s"):
                pt_dist.monitored_barrier(timeout=0.5, wait_all_ranks=True)
        # in a sub-group, ranks are named globally; group rank 0 is global rank 1
        sub = pt_dist.new_group([1, 2])
        if rank == 1:
            with pytest.raises(DistError, match=r"rank\(s\) \[2\]"):
                pt_dist.monitored_barrier(sub, timeout=0.5)
        t = torch.ones(2)
        pt_dist.all_reduce(t)  # it never touched the transport: the group goes on
        results["sum"] = t.tolist()
        world = pt_dist.new_group([0, 1, 2])  # (the world group's call count is off by rank 2's skipped call)
        pt_dist.monitored_barrier(world, timeout=10)
        pt_dist.destroy_process_group()  # at once: rank 0 closed the store under the others still reading it
        return results
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_monitored_barrier_names_the_ranks_that_did_not_arrive(backend):
    res = run_ranks(_monitored, 3, backend, backend=None, timeout=90)
    assert [r["sum"] for r in res] == [[3.0, 3.0]] * 3 and [r["new keys"] for r in res] == [0] * 3
    for r in res[:2]:
        assert r["took"] < 5, res
