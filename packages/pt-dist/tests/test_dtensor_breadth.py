"""torch.distributed.tensor's surface beyond DTensor's mechanism, each beside torch's in the same 2 ranks:
the factories ``linspace`` / ``logspace`` / ``rand`` / ``randn``, ``Shard.local_shard_size_and_offset``,
``debug.CommDebugMode`` (a tensor-parallel MLP's collectives counted under torch's keys, as torch counts them),
``debug.visualize_sharding``, ``experimental.implicit_replication`` and ``experimental.local_map`` (after torch's
test/distributed/tensor/test_init.py, debug/test_comm_mode.py, test_dtensor.py's implicit replication case and
experimental/test_local_map.py), and the ``tensor.device_mesh`` import path."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.tensor as tt
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_device_mesh import _both_worlds  # noqa: E402
from test_dtensor import _close_up, _meshes  # noqa: E402


@pytest.mark.parametrize("size", [0, 1, 5, 7, 8, 13])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_shard_local_shard_size_and_offset_matches_torchs(size, chunks):
    from pt_dist.tensor import Shard

    for rank in range(chunks):
        assert Shard.local_shard_size_and_offset(size, chunks, rank) == tuple(
            int(v) for v in tt.Shard.local_shard_size_and_offset(size, chunks, rank)), (size, chunks, rank)


def _mlp():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


def _tree(mode, path):
    """The JSON dump's module tree: names, types, parameters, collectives (torch also lists operations)."""
    mode.generate_json_dump(path, noise_level=1)
    with open(path) as f:
        dump = json.load(f)

    def strip(node):
        return (node["fqn"], node["module_type"], [tuple(p) for p in node["parameters"]],
                sorted(map(tuple, node["collectives_forward"])), sorted(map(tuple, node["collectives_backward"])),
                [strip(c) for c in node["children"]])

    return strip(dump)


def _comm_counts(lib, tp, mesh, rank, path):
    """A Colwise / Rowwise MLP's forward and backward, and a distribute / redistribute, under CommDebugMode."""
    model = tp.parallelize_module(_mlp(), mesh, {"0": tp.ColwiseParallel(), "2": tp.RowwiseParallel()})
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(rank))
    with lib.debug.CommDebugMode() as mode:
        model(x).sum().backward()
    mlp = ({str(k): v for k, v in mode.get_comm_counts().items()}, mode.get_total_counts(),
           {m: {ph: {str(k): n for k, n in c.items()} for ph, c in d.items()}
            for m, d in mode.comm_module_counts.items()},
           {k: str(v) for k, v in mode.get_sharding_info().items()}, _tree(mode, path))
    with lib.debug.CommDebugMode() as mode:
        d = lib.distribute_tensor(torch.ones(4, 2), mesh, [lib.Shard(0)])
        d.redistribute(mesh, [lib.Replicate()])
        d.redistribute(mesh, [lib.Shard(1)])
    return mlp, ({str(k): v for k, v in mode.get_comm_counts().items()}, mode.get_total_counts())


def _rowscale_op():
    """A custom op (each row scaled by its sum), made once per process."""
    if not hasattr(torch.ops.ptdist_breadth, "rowscale"):
        @torch.library.custom_op("ptdist_breadth::rowscale", mutates_args=())
        def rowscale(x: torch.Tensor, scale: float) -> torch.Tensor:
            return x * scale / x.sum(dim=1, keepdim=True)

        @rowscale.register_fake
        def _(x, scale):
            return torch.empty_like(x)

    return torch.ops.ptdist_breadth.rowscale.default


class _Checkpointed(nn.Module):
    """A TP block under a reentrant activation checkpoint: only its input is saved (what input_reshard is for)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=True)


def _as_torch_cpu(counts: dict) -> dict:
    """Our counts as torch's CPU groups would have them: a Shard -> Shard all-to-all is an all-gather there
    ("CPU process group does not support alltoall yet, falling back with allgather + chunk")."""
    out = dict(counts)
    n = out.pop("_dtensor.shard_dim_alltoall", 0)
    if n:
        out["c10d_functional.all_gather_into_tensor"] = out.get("c10d_functional.all_gather_into_tensor", 0) + n
    return out


def _breadth(rank, world, root):
    import pt_dist.tensor as pt
    import pt_dist.tensor.debug  # noqa: F401
    import pt_dist.tensor.experimental as pt_exp
    import pt_dist.tensor.parallel as pt_tp
    import torch.distributed.tensor.debug  # noqa: F401
    import torch.distributed.tensor.experimental as tt_exp
    import torch.distributed.tensor.parallel as tt_tp
    from pt_dist.tensor.device_mesh import DeviceMesh, init_device_mesh

    _both_worlds(rank, world, "tcp")
    try:
        mesh, tmesh = _meshes((world,))
        out = {"device_mesh path": isinstance(init_device_mesh("cpu", (world,)), DeviceMesh)}
        for name, make in {"linspace S0": lambda lib, m: lib.linspace(-1.0, 2.0, 7, device_mesh=m,
                                                                     placements=[lib.Shard(0)]),
                           "linspace R": lambda lib, m: lib.linspace(0, 1, 5, device_mesh=m),
                           "logspace S0": lambda lib, m: lib.logspace(0.0, 3.0, 5, base=2.0, device_mesh=m,
                                                                     placements=[lib.Shard(0)]),
                           "linspace 1 step": lambda lib, m: lib.linspace(3.0, 5.0, 1, device_mesh=m,
                                                                         placements=[lib.Shard(0)])}.items():
            got, want = make(pt, mesh), make(tt, tmesh)
            out[name] = ((str(got.placements), got.to_local(), got.full_tensor()),
                         (str(want.placements), want.to_local(), want.full_tensor()))
        # rand / randn: a shard drawn from the rank's own generator (torch 2.15 on a CPU mesh has no RNG tracker)
        torch.manual_seed(7)
        r = pt.rand(5, 4, device_mesh=mesh, placements=[pt.Shard(0)])
        torch.manual_seed(7)
        out["rand"] = (r.shape, str(r.placements), r.to_local(), torch.rand(r.to_local().shape))
        torch.manual_seed(8)
        r = pt.randn((4, 3), device_mesh=mesh, requires_grad=True)
        torch.manual_seed(8)
        out["randn"] = (r.shape, str(r.placements), r.requires_grad, r.to_local(), torch.randn(4, 3))
        try:
            tt.rand(5, 4, device_mesh=tmesh)
            out["torch rand"] = "ran"
        except AssertionError:
            out["torch rand"] = "AssertionError"
        out["comm"] = (_comm_counts(pt, pt_tp, mesh, rank, f"{root}/ours{rank}.json"),
                       _comm_counts(tt, tt_tp, tmesh, rank, f"{root}/theirs{rank}.json"))
        # implicit_replication: a plain tensor meets a sharded one
        plain = torch.arange(24.0).reshape(4, 6)
        res = []
        for lib, m, exp in ((pt, mesh, pt_exp), (tt, tmesh, tt_exp)):
            a = lib.distribute_tensor(torch.ones(4, 6), m, [lib.Shard(0)])
            try:
                a + plain
                refused = False
            except RuntimeError:
                refused = True
            with exp.implicit_replication():
                s = a + plain
            res.append((refused, str(s.placements), s.full_tensor()))
        out["implicit"] = res
        # local_map: a function of local tensors on DTensors
        res = []
        for lib, m, exp in ((pt, mesh, pt_exp), (tt, tmesh, tt_exp)):
            x = lib.distribute_tensor(torch.arange(12.0).reshape(4, 3), m, [lib.Shard(0)])
            w = lib.distribute_tensor(torch.ones(3, 2), m, [lib.Replicate()])
            mm = exp.local_map(torch.mm, out_placements=[lib.Shard(0)], in_placements=([lib.Shard(0)],
                                                                                         [lib.Replicate()]))
            y = mm(x, w)
            try:
                mm(w.redistribute(m, [lib.Shard(0)]).t(), w)
                mismatch = None
            except ValueError as e:
                mismatch = "mismatched placements" in str(e)
            again = exp.local_map(torch.mm, out_placements=[lib.Shard(0)], in_placements=(
                [lib.Shard(0)], [lib.Replicate()]), redistribute_inputs=True)(x.redistribute(m, [lib.Replicate()]), w)
            res.append((type(y).__name__, str(y.placements), y.full_tensor(), mismatch, again.full_tensor()))
        out["local_map"] = res
        # register_sharding: a custom op DTensor has no rule for, given one by the user
        rowscale = _rowscale_op()
        res = []
        for lib, m, exp in ((pt, mesh, pt_exp), (tt, tmesh, tt_exp)):
            def strategies(x, scale, lib=lib):
                return [([lib.Replicate()], [lib.Replicate(), None]), ([lib.Shard(0)], [lib.Shard(0), None])]

            exp.register_sharding(rowscale)(strategies)
            for p in (lib.Shard(0), lib.Shard(1), lib.Replicate()):
                x = lib.distribute_tensor(torch.arange(1.0, 25.0).reshape(4, 6), m, [p])
                y = rowscale(x, 2.0)
                res.append((str(y.placements), y.full_tensor()))
        out["register_sharding"] = res
        # input_reshard: what a TP module saves kept sharded, gathered back in backward
        from pt_dist.tensor.parallel.input_reshard import input_reshard as pt_reshard
        from torch.distributed.tensor.parallel.input_reshard import input_reshard as tt_reshard

        res = []
        for lib, tp, m, reshard in ((pt, pt_tp, mesh, pt_reshard), (tt, tt_tp, tmesh, tt_reshard)):
            for use in (False, True):
                model = _Checkpointed(tp.parallelize_module(_mlp(), m, {"0": tp.ColwiseParallel(),
                                                                       "2": tp.RowwiseParallel()}))
                if use:
                    reshard(model, m, 0)
                xin = torch.randn(4, 6, generator=torch.Generator().manual_seed(9)).requires_grad_()  # replicated
                with lib.debug.CommDebugMode() as mode:
                    model(xin).sum().backward()
                res.append(({str(k): v for k, v in mode.get_comm_counts().items()}, xin.grad,
                            [p.grad.full_tensor() for p in model.parameters()]))
        out["input_reshard"] = res
        # DeviceMesh.abort: a root mesh's own groups (a permuted 1-D mesh has one of its own), not a sub-mesh's
        import pt_dist
        from pt_dist.device_mesh import DeviceMesh as PtMesh
        from torch.distributed.device_mesh import init_device_mesh as torch_init

        errors = []
        for make in (lambda: init_device_mesh("cpu", (1, world), mesh_dim_names=("a", "b"))["b"],
                     lambda: torch_init("cpu", (1, world), mesh_dim_names=("a", "b"))["b"]):
            try:
                make().abort()
            except RuntimeError as e:
                errors.append(str(e))
        perm = PtMesh("cpu", list(reversed(range(world))))
        perm.abort()
        try:
            pt_dist.all_reduce(torch.ones(2), group=perm.get_group())
            errors.append("all_reduce ran")
        except Exception as e:  # noqa: BLE001  (the group's failure, whatever its type)
            errors.append(f"{type(e).__name__}: {e}")
        pt_dist.all_reduce(torch.ones(2))  # the world is not the mesh's: it goes on
        out["abort"] = errors
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            pt.debug.visualize_sharding(pt.distribute_tensor(torch.ones(4, 6), mesh, [pt.Shard(0)]))
        out["visualize"] = printed.getvalue()
        return out
    finally:
        _close_up()


def test_tensor_breadth_matches_torchs_in_the_same_ranks(tmp_path):
    results = run_ranks(_breadth, 2, str(tmp_path), backend=None, timeout=180)
    for rank, out in enumerate(results):
        assert out["device_mesh path"]
        for name in ("linspace S0", "linspace R", "logspace S0", "linspace 1 step"):
            (p, local, full), (t_p, t_local, t_full) = out[name]
            assert p == t_p and torch.equal(local, t_local) and torch.equal(full, t_full), (name, rank, local, t_local)
        shape, placements, local, want = out["rand"]
        assert shape == (5, 4) and local.shape == ((3, 4) if rank == 0 else (2, 4)) and torch.equal(local, want)
        shape, placements, grad, local, want = out["randn"]
        assert shape == (4, 3) and grad and torch.equal(local, want)
        assert out["torch rand"] == "AssertionError"  # torch 2.15: no DTensor RNG on a CPU mesh
        (mlp, moved), (t_mlp, t_moved) = out["comm"]
        # same ops, same counts, under torch's keys, per module and pass; the parameters' placements; the JSON tree
        assert mlp == t_mlp and mlp[1] > 0 and len(mlp[3]) == 4, (mlp, t_mlp)
        assert set(mlp[2]) == {"Global", "Sequential", "Sequential.2"}, mlp[2]  # the row-wise layer's all-reduce
        # scatter, all-gather, then Shard(0) -> Shard(1): an all-to-all here, where torch's CPU group falls back to
        # a second all-gather ("CPU process group does not support alltoall yet")
        assert moved[0] == {"c10d.scatter_": 1, "c10d_functional.all_gather_into_tensor": 1,
                            "_dtensor.shard_dim_alltoall": 1}, moved
        assert t_moved[0] == {"c10d.scatter_": 1, "c10d_functional.all_gather_into_tensor": 2}, t_moved
        (refused, p, full), (t_refused, t_p, t_full) = out["implicit"]
        assert refused and t_refused and p == t_p and torch.equal(full, t_full)
        (kind, p, full, mismatch, again), (t_kind, t_p, t_full, t_mismatch, t_again) = out["local_map"]
        assert kind == "DTensor" and p == t_p and torch.equal(full, t_full) and torch.equal(again, t_again)
        assert mismatch is True and t_mismatch is True
        ours_rs, theirs_rs = out["register_sharding"][:3], out["register_sharding"][3:]
        want = torch.arange(1.0, 25.0).reshape(4, 6)
        want = want * 2.0 / want.sum(dim=1, keepdim=True)
        for (p, full), (t_p, t_full) in zip(ours_rs, theirs_rs):
            assert p == t_p and torch.allclose(full, want) and torch.allclose(t_full, want), (p, t_p)
        (plain, resharded, t_plain, t_resharded) = out["input_reshard"]
        for (counts, xgrad, grads), (t_counts, t_xgrad, t_grads) in ((plain, t_plain), (resharded, t_resharded)):
            assert _as_torch_cpu(counts) == t_counts, (counts, t_counts)
            assert torch.allclose(xgrad, t_xgrad, rtol=1e-5, atol=1e-6)
            assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(grads, t_grads))
        # the same gradients, and the saved input gathered back: one more all-gather than without
        assert torch.allclose(resharded[1], plain[1], rtol=1e-5, atol=1e-6)
        assert sum(resharded[0].values()) == sum(plain[0].values()) + 1, (plain[0], resharded[0])
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(resharded[2], plain[2]))
        sub, t_sub, after = out["abort"]
        assert sub == t_sub and "not supported on a submesh" in sub, (sub, t_sub)
        assert "abort" in after, after  # the aborted mesh's group refuses, naming why
    assert "Row 0-1" in results[0]["visualize"] and "cpu:1" in results[0]["visualize"]
    assert results[1]["visualize"] == ""  # printed by the mesh's first rank only, as torch's
