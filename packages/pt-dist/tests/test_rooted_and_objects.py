"""gather / scatter and the object collectives, on tcp, shm and torch's own gloo.

Values are checked against what the ranks built locally; on the gloo adapter (torch's real group) the
object collectives are also run through ``torch.distributed``'s own functions in the same ranks and
must give the same objects. Bad arguments raise before any communication; ranks that disagree on a
gather's shape all raise.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import DistError

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402
from test_collectives import shaped  # noqa: E402

NATIVE_DTYPES = [torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64]
SIZES = [0, 1, 1031, "nc"]


def _rooted(rank, world_size, backend, dtypes, staged=False):
    from pt_dist._infra import cma
    from pt_dist.backends import tcp
    from pt_dist.backends.shm import process_group_shm as shm

    saved = tcp.CHUNK_BYTES, shm.SLOT_BYTES, cma.MIN_BYTES
    # 1031 elements cross many tcp chunks and shm staging rounds (256 elements of 4 bytes per round);
    # on shm, buffers from 4 KiB take the single-copy path unless ``staged``
    tcp.CHUNK_BYTES, shm.SLOT_BYTES, cma.MIN_BYTES = 512, 2048, 1 << 40 if staged else 4096
    try:
        util.join(rank, world_size, backend, key=f"rooted-{backend}-{world_size}")
        check = util.Checks(f"{backend} ws={world_size} rank={rank}")

        ws, me = world_size, rank
        for dtype in dtypes:
            for salt, size in enumerate(SIZES):
                for root in range(ws):
                    tag = f"{dtype} size={size} root={root}"
                    everyone = [shaped(r, size, dtype, salt) for r in range(ws)]
                    outs = [torch.zeros_like(everyone[0]) for _ in range(ws)] if me == root else None
                    pt_dist.gather(shaped(me, size, dtype, salt), outs, dst=root)
                    for r in range(ws if me == root else 0):
                        check(f"gather[{r}] {tag}", outs[r], everyone[r])
                    pieces = [shaped(r, size, dtype, salt + 1) for r in range(ws)]
                    got = torch.zeros_like(pieces[me])  # non-contiguous when size is "nc"
                    pt_dist.scatter(got, pieces if me == root else None, src=root)
                    check(f"scatter {tag}", got, pieces[me])
        # async forms overlap the caller and complete in order; a sub-group takes global ranks
        got = torch.zeros(3)
        work = pt_dist.scatter(got, [torch.full((3,), r + 0.5) for r in range(ws)] if me == 0 else None, src=0,
                               async_op=True)
        work.wait()
        check("async scatter", got, torch.full((3,), me + 0.5))
        if ws >= 3:
            sub = pt_dist.new_group([0, ws - 1])
            if me in (0, ws - 1):
                outs = [torch.zeros(2) for _ in range(2)] if me == ws - 1 else None
                pt_dist.gather(torch.full((2,), float(me)), outs, dst=ws - 1, group=sub)
                if me == ws - 1:
                    check("sub-group gather", torch.stack(outs), torch.tensor([[0.0, 0.0], [ws - 1.0] * 2]))
        util.leave()
        return check.fails, check.count
    finally:
        tcp.CHUNK_BYTES, shm.SLOT_BYTES, cma.MIN_BYTES = saved
        if pt_dist.is_initialized():
            pt_dist.destroy_process_group()


@pytest.mark.parametrize("backend,staged", [("tcp", False), ("shm", False), ("shm", True)])
def test_gather_and_scatter_on_native_backends(backend, staged):
    for ws in (4, 3, 1):
        for rank, (fails, checks) in enumerate(run_ranks(_rooted, ws, backend, NATIVE_DTYPES, staged, backend=None,
                                                         timeout=240)):
            assert fails == []
            per_case = len(NATIVE_DTYPES) * len(SIZES)
            # every root: one scatter check; as the root, ws gather checks; plus the async scatter and sub-group
            assert checks == per_case * (ws + ws) + 1 + (ws >= 3 and rank == ws - 1), (ws, rank, checks)


def test_gather_and_scatter_on_gloo_adapter():
    for rank, (fails, checks) in enumerate(run_ranks(_rooted, 3, "gloo", [torch.float32, torch.int64],
                                                     backend=None, timeout=240)):
        assert fails == []
        assert checks == 2 * len(SIZES) * 6 + 1 + (rank == 2)


def _canonical(x):
    """Objects with tensors inside, made comparable with ==."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), x.tolist())
    if isinstance(x, (list, tuple)):
        return type(x)(_canonical(v) for v in x)
    if isinstance(x, dict):
        return {k: _canonical(v) for k, v in x.items()}
    return x


class Opaque:
    """Not something torch.load(weights_only=True) rebuilds."""


def _obj(r: int):
    # rank 2's object is ~80 KB, far longer than the others, so the padding to the longest is exercised
    return {"rank": r, "t": torch.arange(r + 1.0), "blob": "x" * (40_000 * r), "nested": [r, None, (r, "a")]}


def _objects(rank, world_size, backend):
    util.join(rank, world_size, backend, key=f"objects-{backend}")
    impls = {"ours": pt_dist}
    if backend == "gloo":
        import torch.distributed as dist

        impls["torch"] = dist  # the adapter runs torch's real default group: call torch's own functions on it
    out = {}
    for name, lib in impls.items():
        got = [None] * world_size
        lib.all_gather_object(got, _obj(rank))
        out[(name, "all_gather_object")] = got
        got = [None] * world_size if rank == 1 else None
        lib.gather_object(_obj(rank), got, dst=1)
        out[(name, "gather_object")] = got
        got = [_obj(2), "second", 3] if rank == 2 else [None] * 3
        lib.broadcast_object_list(got, src=2)
        out[(name, "broadcast_object_list")] = got
        got = [None]
        # the other ranks' input lists are ignored, as in torch's own docstring example (they pass [None] * world)
        lib.scatter_object_list(got, [_obj(r + 10) if rank == 0 else None for r in range(world_size)], src=0)
        out[(name, "scatter_object_list")] = got[0]
        # torch 2.15's spellings: the group's own root numbering, weights_only (torch.load's safe unpickler)
        got = [None] * world_size
        lib.all_gather_object(got, _obj(rank), weights_only=True)
        out[(name, "all_gather_object weights_only")] = got
        got = [_obj(1), "x"] if rank == 1 else [None, None]
        lib.broadcast_object_list(got, group_src=1, weights_only=True)
        out[(name, "broadcast_object_list group_src")] = got
        got = [None] * world_size if rank == 2 else None
        lib.gather_object(rank * 10, got, group_dst=2)
        out[(name, "gather_object group_dst")] = got
        if rank == 0:  # a pipeline stage announcing shapes to the next one
            lib.send_object_list([{"shape": (4, 8)}, _obj(0)], dst=2)
        elif rank == 2:
            got = [None, None]
            out[(name, "recv_object_list from")] = lib.recv_object_list(got, src=0)
            out[(name, "recv_object_list")] = got
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            lib.all_gather_object([None] * world_size, Opaque(), weights_only=True)  # refused on every receiver
    util.leave()
    return {k: _canonical(v) for k, v in out.items()}


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_object_collectives(backend):
    ws = 3
    everyone = [_canonical(_obj(r)) for r in range(ws)]
    for rank, res in enumerate(run_ranks(_objects, ws, backend, backend=None, timeout=120)):
        assert res[("ours", "all_gather_object")] == everyone
        assert res[("ours", "gather_object")] == (everyone if rank == 1 else None)
        assert res[("ours", "broadcast_object_list")] == [everyone[2], "second", 3]
        assert res[("ours", "scatter_object_list")] == _canonical(_obj(rank + 10))
        assert res[("ours", "all_gather_object weights_only")] == everyone
        assert res[("ours", "broadcast_object_list group_src")] == [everyone[1], "x"]
        assert res[("ours", "gather_object group_dst")] == ([0, 10, 20] if rank == 2 else None)
        if rank == 2:
            assert res[("ours", "recv_object_list")] == [{"shape": (4, 8)}, everyone[0]]
            assert res[("ours", "recv_object_list from")] == 0
        for (impl, op), value in res.items():  # torch.distributed's own functions agree, call for call
            if impl == "torch":
                assert value == res[("ours", op)], (rank, op)


def _bad_arguments(rank, world_size, backend):
    """Each call raises on this rank alone, before communicating: the group is still in step afterwards."""
    util.join(rank, world_size, backend, key=f"bad-{backend}")
    ws, x = world_size, torch.ones(4)
    other = pt_dist.new_group([0, 1])
    cases = {
        "gather_list on a non-dst rank": lambda: pt_dist.gather(x, [torch.ones(4)] * ws, dst=(rank + 1) % ws),
        "gather_list too short": lambda: pt_dist.gather(x, [torch.ones(4)], dst=rank),
        "gather_list dtype": lambda: pt_dist.gather(x, [torch.ones(4, dtype=torch.int64)] * ws, dst=rank),
        "gather dst outside": lambda: pt_dist.gather(x, None, dst=ws),
        "scatter_list missing on src": lambda: pt_dist.scatter(x, None, src=rank),
        "scatter_list sizes": lambda: pt_dist.scatter(x, [torch.ones(5)] * ws, src=rank),
        "P2POp op": lambda: pt_dist.P2POp(pt_dist.all_reduce, x, 1),
        "empty batch": lambda: pt_dist.batch_isend_irecv([]),
        "mixed groups": lambda: pt_dist.batch_isend_irecv([pt_dist.P2POp(pt_dist.isend, x, 1 - rank % 2),
                                                           pt_dist.P2POp(pt_dist.irecv, x, 1 - rank % 2, other)]),
        "peer is this rank": lambda: pt_dist.batch_isend_irecv([pt_dist.P2POp(pt_dist.isend, x, rank)]),
        "peer outside": lambda: pt_dist.batch_isend_irecv([pt_dist.P2POp(pt_dist.isend, x, ws + 3)]),
        "all_gather_object slots": lambda: pt_dist.all_gather_object([None], "a"),
        "gather_object list on non-dst": lambda: pt_dist.gather_object("a", [None] * ws, dst=(rank + 1) % ws),
        "broadcast_object_list empty": lambda: pt_dist.broadcast_object_list([], src=0),
    }
    seen = {}
    for name, call in cases.items():
        try:
            call()
            seen[name] = "no error"
        except (ValueError, TypeError) as e:
            seen[name] = type(e).__name__
    # ranks that disagree on a gather's shape all raise (native backends compare headers first)
    try:
        outs = [torch.zeros(4) for _ in range(ws)] if rank == 0 else None
        pt_dist.gather(torch.ones(5 if rank == 2 else 4), outs, dst=0)
        seen["shape mismatch"] = "no error"
    except DistError as e:
        seen["shape mismatch"] = "mismatched" in str(e)
    t = torch.ones(2)
    pt_dist.all_reduce(t)
    seen["still in step"] = t.tolist()
    util.leave()
    return seen


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_bad_arguments_raise_before_communicating(backend):
    for seen in run_ranks(_bad_arguments, 3, backend, backend=None, timeout=120):
        assert seen.pop("shape mismatch") is True
        assert seen.pop("still in step") == [3.0, 3.0]
        assert all(v in ("ValueError", "TypeError") for v in seen.values()), seen


def test_native_backends_run_without_numpy(tmp_path):
    """torch does not depend on numpy, so pt-dist must not either: tcp collectives and p2p with numpy blocked."""
    script = textwrap.dedent("""
        import sys, threading
        sys.modules["numpy"] = None  # any `import numpy` (and Tensor.numpy()) now fails
        import torch
        from pt_dist import TCPStore
        from pt_dist._infra.store import PrefixStore
        from pt_dist.backends.tcp import ProcessGroupTCP

        master = TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=30)
        stores = [master, TCPStore("127.0.0.1", master.port, 2, is_master=False, timeout=30)]
        results = [None, None]

        def rank(r):
            try:
                run(r)
            except Exception as e:
                results[r] = repr(e)

        def run(r):
            pg = ProcessGroupTCP(PrefixStore("g", stores[r]), r, 2, 30.0, "g", b"secret")
            t = torch.full((300_000,), r + 1.0)
            pg.all_reduce(t)
            got = torch.empty(3)
            w = pg.send(torch.full((3,), 7.0 + r), 1 - r)
            pg.recv(got, 1 - r).wait()
            w.wait()
            results[r] = (t[0].item(), t[-1].item(), got.tolist())
            pg.barrier()
            pg.shutdown()

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        [th.start() for th in threads]
        [th.join(60) for th in threads]
        print(results)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[(3.0, 3.0, [8.0, 8.0, 8.0]), (3.0, 3.0, [7.0, 7.0, 7.0])]"


def _group_ranks(rank, world_size, backend):
    """torch's second spelling of roots and peers: group_src / group_dst / group_peer, in the group's numbering."""
    util.join(rank, world_size, backend, key=f"group-ranks-{backend}")
    sub, out = pt_dist.new_group([1, 3]), {}
    if rank in (1, 3):
        me = pt_dist.get_rank(sub)
        t = torch.full((4,), float(rank))
        pt_dist.broadcast(t, group_src=1, group=sub)  # the group's rank 1 is global rank 3
        out["broadcast"] = t[0].item()
        outs = [torch.zeros(2) for _ in range(2)] if me == 0 else None
        pt_dist.gather(torch.full((2,), float(rank)), outs, group_dst=0, group=sub)
        out["gather"] = [o[0].item() for o in outs] if outs else None
        got = torch.zeros(2)
        pt_dist.scatter(got, [torch.full((2,), 10.0), torch.full((2,), 11.0)] if me == 1 else None, group_src=1,
                        group=sub)
        out["scatter"] = got[0].item()
        x = torch.full((3,), float(rank))
        if me == 0:
            pt_dist.send(x, group_dst=1, group=sub)
        else:
            out["recv from"] = pt_dist.recv(x, group_src=0, group=sub)  # the sender's global rank, as torch
        back = torch.zeros(3)
        works = pt_dist.batch_isend_irecv([pt_dist.P2POp(pt_dist.isend, torch.full((3,), float(rank)), group=sub,
                                                         group_peer=1 - me),
                                           pt_dist.P2POp(pt_dist.irecv, back, group=sub, group_peer=1 - me)])
        [w.wait() for w in works]
        out["batch"] = back[0].item()
        errors = []
        for call in (lambda: pt_dist.broadcast(t, src=1, group=sub, group_src=0),
                     lambda: pt_dist.gather(t, None, group=sub, group_dst=2),
                     lambda: pt_dist.isend(t, group=sub),
                     lambda: pt_dist.batch_isend_irecv([pt_dist.P2POp(pt_dist.isend, t, group=sub)])):
            try:
                call()
                errors.append("no error")
            except ValueError as e:
                errors.append(str(e).split(" ")[0])
        out["errors"] = errors
        pt_dist.barrier(group=sub)
    util.leave()
    return out


@pytest.mark.parametrize("backend", ["tcp", "gloo"])
def test_group_src_and_group_dst_name_ranks_in_the_group(backend):
    res = run_ranks(_group_ranks, 4, backend, backend=None, timeout=120)
    assert res[0] == res[2] == {}
    errors = ["pass", "group_dst=2", "name", "name"]
    assert res[1] == {"broadcast": 3.0, "gather": [1.0, 3.0], "scatter": 10.0, "batch": 3.0, "errors": errors}
    assert res[3] == {"broadcast": 3.0, "gather": None, "scatter": 11.0, "recv from": 1, "batch": 1.0,
                      "errors": errors}
