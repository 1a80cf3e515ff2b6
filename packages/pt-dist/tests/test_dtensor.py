"""DTensor on pt_dist groups next to torch's own DTensor on a gloo group in the same ranks, after torch's
test/distributed/tensor/test_dtensor.py (DTensorTest: from_local, to_local, full_tensor, the gradients through
them, uneven sharding), test_redistribute.py (RedistributeTest: every placement pair on 1-d and 2-d meshes,
uneven shapes) and test_utils.py (compute_local_shape_and_global_offset): the same local shards, the same full
tensors, the same gradients; bad input named before any communication."""

from __future__ import annotations

import itertools
import pickle
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed as dist
import torch.distributed.tensor as tt
from pt_dist.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from pt_dist.tensor._utils import _local_shape_and_offset

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import error_recorder, leave  # noqa: E402
from test_device_mesh import _both_worlds, _describe  # noqa: E402


def _torch_placement(p):
    if isinstance(p, Shard):
        return tt.Shard(p.dim)
    return tt.Replicate() if p.is_replicate() else tt.Partial(p.reduce_op)


def _as_torch(placements):
    return [_torch_placement(p) for p in placements]


def _meshes(shape, names=None):
    from pt_dist.device_mesh import init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init

    return init_device_mesh("cpu", shape, mesh_dim_names=names), torch_init("cpu", shape, mesh_dim_names=names)


def _close_up():
    leave()
    if dist.is_initialized():
        dist.destroy_process_group()


def _rank_tensor(rank, shape, seed=0):
    """A different tensor on every rank (what from_local's Partial terms and distribute_tensor's source rule see)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed + 1000 * rank))


# -- the 4-rank case first: its pool then serves the 2-rank ones (one start of processes, not two) ----------------
# nested (the same tensor dim on both mesh dims), crossed, half-replicated: every pair (torch's test_redistribute.py
# RedistributeTest.test_multi_dim_mesh / test_redistribute_uneven_sharding, cut to fit a 2-core machine)
_PLACEMENTS_2D = [(Shard(0), Shard(0)), (Shard(0), Shard(1)), (Shard(1), Replicate()), (Replicate(), Shard(0)),
                  (Replicate(), Replicate())]
_PARTIAL_2D = [(Partial(), Shard(0)), (Partial(), Partial()), (Shard(1), Partial())]


def _two_d(rank, world):
    _both_worlds(rank, world, "tcp")
    try:
        mesh, tmesh = _meshes((2, 2), ("dp", "tp"))
        described = (_describe(mesh, pt_dist.get_process_group_ranks, lambda m, d: m.get_local_rank(d)),
                     _describe(tmesh, dist.get_process_group_ranks, lambda m, d: m.get_local_rank(d)))
        x = _rank_tensor(0, (5, 7))  # uneven on both dims: chunks of 3 and 2, 4 and 3 (and nested: 2+1, 1+1)
        got, want = [], []
        for src, dst in itertools.product(_PLACEMENTS_2D, _PLACEMENTS_2D):
            ours = distribute_tensor(x, mesh, src).redistribute(mesh, dst)
            theirs = tt.distribute_tensor(x, tmesh, _as_torch(src)).redistribute(tmesh, _as_torch(dst))
            got.append((str(src), str(dst), ours.to_local(), ours.placements == dst, ours.full_tensor()))
            want.append((str(src), str(dst), theirs.to_local(), True, theirs.full_tensor()))
        local = _rank_tensor(rank, (4, 6))
        for src, dst in itertools.product(_PARTIAL_2D, [(Replicate(), Replicate()), (Shard(0), Shard(1)),
                                                        (Replicate(), Shard(0))]):
            ours = DTensor.from_local(local, mesh, src).redistribute(mesh, dst)
            theirs = tt.DTensor.from_local(local, tmesh, _as_torch(src)).redistribute(tmesh, _as_torch(dst))
            got.append((str(src), str(dst), ours.to_local(), ours.placements == dst, ours.full_tensor()))
            want.append((str(src), str(dst), theirs.to_local(), True, theirs.full_tensor()))
        return described, got, want
    finally:
        _close_up()


def _assert_same_locals(got, want):
    assert len(got) == len(want) > 0
    for (src, dst, local, placed, full), (_, _, tlocal, _, tfull) in zip(got, want):
        assert placed, (src, dst)
        assert local.shape == tlocal.shape, (src, dst, local.shape, tlocal.shape)
        torch.testing.assert_close(local, tlocal, rtol=1e-6, atol=1e-6, msg=f"{src} -> {dst}")
        torch.testing.assert_close(full, tfull, rtol=1e-6, atol=1e-6, msg=f"{src} -> {dst} full")


def test_2x2_mesh_redistribute_matches_torchs_on_4_ranks():
    for described, got, want in run_ranks(_two_d, 4, backend=None, timeout=180):
        assert described[0] == described[1]
        _assert_same_locals(got, want)


# -- placements and shard arithmetic (no ranks) --------------------------------------------------------------------
def test_placements_match_torchs():
    ours = [Shard(0), Shard(1), Shard(-1), Replicate(), Partial(), Partial("avg"), Partial("max")]
    for a, b in itertools.product(ours, ours):
        assert (a == b) == (_torch_placement(a) == _torch_placement(b)), (a, b)
    for p in ours:
        tp = _torch_placement(p)
        assert (repr(p), str(p), hash(p)) == (repr(tp), str(tp), hash(tp))
        assert (p.is_shard(), p.is_shard(0), p.is_replicate(), p.is_partial(), p.is_partial("sum")) == \
            (tp.is_shard(), tp.is_shard(0), tp.is_replicate(), tp.is_partial(), tp.is_partial("sum"))
        assert pickle.loads(pickle.dumps(p)) == p
    assert len({Shard(0), Shard(0), Replicate(), Replicate(), Partial()}) == 3
    with pytest.raises(AttributeError, match="immutable"):
        Shard(0).dim = 1
    with pytest.raises(ValueError, match="'mean'"):
        Partial("mean")
    with pytest.raises(TypeError, match="'a'"):
        Shard("a")


@pytest.mark.parametrize("shape,mesh_shape,placements", [
    ((8, 4), (2,), (Shard(0),)), ((5, 3), (2,), (Shard(0),)), ((3, 5), (4,), (Shard(0),)),
    ((1, 5), (4,), (Shard(0),)), ((7, 5), (2, 2), (Shard(0), Shard(0))), ((7, 5), (2, 2), (Shard(0), Shard(1))),
    ((5, 7), (2, 3), (Shard(1), Shard(1))), ((5, 3), (2, 2), (Replicate(), Shard(1))),
    ((2, 3, 5), (3, 2), (Shard(2), Partial())), ((0, 4), (2,), (Shard(0),)),
])
def test_local_shape_and_offset_match_torchs(shape, mesh_shape, placements):
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset as theirs

    for coord in itertools.product(*[range(n) for n in mesh_shape]):
        got = _local_shape_and_offset(shape, mesh_shape, list(coord), placements)
        assert got == theirs(shape, mesh_shape, list(coord), _as_torch(placements)), coord


# -- 1-d: every placement pair, uneven, on tcp, shm and pt_dist's gloo adapter -------------------------------------
_PLACEMENTS_1D = [Shard(0), Shard(1), Replicate()]


def _one_d(rank, world, backend):
    _both_worlds(rank, world, backend)
    try:
        mesh, tmesh = _meshes((world,))
        got, want = [], []
        for shape in [(5, 3), (4, 6), (1, 3)]:
            x = _rank_tensor(rank, shape)  # distribute_tensor takes rank 0's: both must ignore rank 1's
            for src, dst in itertools.product(_PLACEMENTS_1D, _PLACEMENTS_1D + [Partial()]):
                if dst.is_partial() and not src.is_shard():
                    continue  # only Shard -> Partial(sum) is a public redistribution
                ours = distribute_tensor(x, mesh, [src]).redistribute(mesh, [dst])
                theirs = tt.distribute_tensor(x, tmesh, [_torch_placement(src)]).redistribute(
                    tmesh, [_torch_placement(dst)])
                got.append((f"{shape} {src}", str(dst), ours.to_local(), ours.placements == (dst,),
                            ours.full_tensor()))
                want.append((f"{shape} {src}", str(dst), theirs.to_local(), True, theirs.full_tensor()))
            for dst in _PLACEMENTS_1D:  # Partial sources: each rank's own term
                ours = DTensor.from_local(x, mesh, [Partial()]).redistribute(mesh, [dst])
                theirs = tt.DTensor.from_local(x, tmesh, [tt.Partial()]).redistribute(tmesh, [_torch_placement(dst)])
                got.append((f"{shape} P", str(dst), ours.to_local(), ours.placements == (dst,), ours.full_tensor()))
                want.append((f"{shape} P", str(dst), theirs.to_local(), True, theirs.full_tensor()))
        # from_local: the global shape from equal shards, or given; run_check broadcasts the first replica
        ours = DTensor.from_local(_rank_tensor(rank, (2, 3)), mesh, [Shard(1)])
        theirs = tt.DTensor.from_local(_rank_tensor(rank, (2, 3)), tmesh, [tt.Shard(1)])
        meta = [(ours.shape, ours.stride(), ours.placements == (Shard(1),)),
                (theirs.shape, theirs.stride(), True)]
        uneven = DTensor.from_local(torch.ones(3 - rank, 2), mesh, [Shard(0)], shape=(5, 2), stride=(2, 1))
        checked = DTensor.from_local(_rank_tensor(rank, (3,)), mesh, [Replicate()], run_check=True)
        extra = (uneven.full_tensor(), checked.to_local(), DTensor.from_local(torch.ones(2), mesh).placements)
        return got, want, meta, extra
    finally:
        _close_up()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_1d_redistribute_matches_torchs(backend):
    for got, want, meta, (uneven, checked, default) in run_ranks(_one_d, 2, backend, backend=None, timeout=120):
        _assert_same_locals(got, want)
        assert meta[0] == meta[1]
        assert torch.equal(uneven, torch.ones(5, 2))
        assert torch.equal(checked, _rank_tensor(0, (3,)))
        assert default == (Replicate(),)


# -- gradients through from_local / to_local / redistribute / full_tensor ------------------------------------------
def _gradients(rank, world):
    _both_worlds(rank, world, "tcp")
    try:
        mesh, tmesh = _meshes((world,))
        w = _rank_tensor(7, (6, 3))  # the same weights everywhere
        out = []
        for api in (DTensor, tt.DTensor):
            m, pl = (mesh, (Shard, Replicate, Partial)) if api is DTensor else (tmesh, (tt.Shard, tt.Replicate,
                                                                                      tt.Partial))
            S, R, P = pl
            grads = []
            # Shard forward: gradient Shard (this rank's rows of the upstream gradient)
            x = _rank_tensor(rank, (3, 3)).requires_grad_()
            full = api.from_local(x, m, [S(0)]).redistribute(m, [R()]).to_local()
            (full * w).sum().backward()
            grads.append(x.grad)
            # Partial forward: gradient Replicate (every rank the whole upstream gradient)
            x = _rank_tensor(rank, (6, 3)).requires_grad_()
            (api.from_local(x, m, [P()]).full_tensor() * w).sum().backward()
            grads.append(x.grad)
            # to_local with grad_placements, and a Shard -> Shard(1) round trip
            x = _rank_tensor(rank, (3, 3)).requires_grad_()
            d = api.from_local(x, m, [S(0)]).redistribute(m, [S(1)])
            (d.to_local(grad_placements=[S(1)]) * rank).sum().backward()
            grads.append(x.grad)
            out.append(grads)
        return out
    finally:
        _close_up()


def test_gradients_through_from_local_and_to_local_match_torchs():
    for ours, theirs in run_ranks(_gradients, 2, backend=None, timeout=120):
        assert len(ours) == len(theirs) == 3
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# -- factories and distribute_module (torch's test_dtensor.py test_dtensor_factory / DTensorAPITest) -------------
def _inputs_to(api):
    return lambda mod, inputs, mesh: tuple(api.from_local(t, mesh) for t in inputs)


def _factories_and_modules(rank, world):
    from pt_dist.tensor import distribute_module, full, ones, zeros

    _both_worlds(rank, world, "tcp")
    try:
        mesh, tmesh = _meshes((world,))
        made = []
        for ours, theirs, args in ((zeros, tt.zeros, (5, 3)), (ones, tt.ones, ((3, 5),))):
            a = ours(*args, device_mesh=mesh, placements=[Shard(0)])
            b = theirs(*args, device_mesh=tmesh, placements=[tt.Shard(0)])
            made.append(((a.shape, a.stride(), a.to_local()), (b.shape, b.stride(), b.to_local())))
        a = full((3, 5), 2.5, device_mesh=mesh, placements=[Shard(1)], requires_grad=True)
        b = tt.full((3, 5), 2.5, device_mesh=tmesh, placements=[tt.Shard(1)], requires_grad=True)
        made.append(((a.shape, a.requires_grad, a.to_local()), (b.shape, b.requires_grad, b.to_local())))

        outs = []
        for api, m, S, dm in ((DTensor, mesh, Shard, distribute_module), (tt.DTensor, tmesh, tt.Shard,
                                                                          tt.distribute_module)):
            def shard_weights(name, sub, mesh, S=S, dist_tensor=distribute_tensor if api is DTensor else
                              tt.distribute_tensor):
                if isinstance(sub, torch.nn.Linear):
                    sub.weight = torch.nn.Parameter(dist_tensor(sub.weight.data, mesh, [S(0)]))

            torch.manual_seed(0)
            model = dm(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4)), m,
                       shard_weights, _inputs_to(api), lambda mod, out, mesh: out.full_tensor())
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
            y = model(x)
            y.sum().backward()
            outs.append((y, [str(p.placements) for p in model.parameters()],
                         [p.grad.full_tensor() for p in model.parameters()]))
        twice = None
        try:
            distribute_module(model, mesh)
        except RuntimeError as e:
            twice = str(e)
        return made, outs, twice
    finally:
        _close_up()


def test_factories_and_distribute_module_match_torchs():
    for made, (ours, theirs), twice in run_ranks(_factories_and_modules, 2, backend=None, timeout=120):
        for got, want in made:
            assert got[:2] == want[:2]
            torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
        torch.testing.assert_close(ours[0], theirs[0], rtol=1e-6, atol=1e-6)
        assert ours[1] == theirs[1] == ["(Shard(dim=0),)", "(Replicate(),)"] * 2
        for a, b in zip(ours[2], theirs[2]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert "already been called" in twice


# -- bad input ------------------------------------------------------------------------------------------------------
def _bad(rank, world):
    _both_worlds(rank, world, "tcp")
    errors = {}
    record = error_recorder(errors)

    try:
        mesh, _ = _meshes((world,))
        x = torch.randn(4, 4)
        d = distribute_tensor(x, mesh, [Shard(0)])
        record("dim_range", lambda: distribute_tensor(x, mesh, [Shard(2)]))
        record("from_local_dim", lambda: DTensor.from_local(x, mesh, [Shard(-3)]))
        record("length", lambda: distribute_tensor(x, mesh, [Shard(0), Replicate()]))
        record("not_placement", lambda: distribute_tensor(x, mesh, ["S0"]))
        record("to_partial", lambda: d.redistribute(mesh, [Replicate()]).redistribute(mesh, [Partial()]))
        record("no_rule", lambda: torch.cumsum(d, 0))
        record("mixed", lambda: d + torch.ones(4, 4))
        record("nested", lambda: DTensor.from_local(d, mesh, [Shard(0)]))
        record("non_leaf", lambda: distribute_tensor(x.requires_grad_() * 2, mesh, [Shard(0)]))
        p = DTensor.from_local(torch.ones(4, 4), mesh, [Partial()])
        record("inplace_partial", lambda: p.sqrt_())
        record("fill_partial", lambda: p.fill_(1.0))
        record("other_mesh", lambda: d + distribute_tensor(x, _meshes((world,))[0].__class__(
            "cpu", [1, 0]), [Shard(0)]))
        scalar = (d * torch.tensor(2.0)).full_tensor()  # a one-element plain tensor is a replicated scalar
        return errors, scalar
    finally:
        _close_up()


def test_bad_input_is_named():
    errors, scalar = run_ranks(_bad, 2, backend=None, timeout=60)[0]
    assert errors["dim_range"][0] == "IndexError" and "Shard(dim=2)" in errors["dim_range"][1]
    assert errors["from_local_dim"][0] == "IndexError" and "Shard(dim=-3)" in errors["from_local_dim"][1]
    assert errors["length"][0] == "ValueError" and "placements length: 2" in errors["length"][1]
    assert errors["not_placement"][0] == "TypeError" and "'S0'" in errors["not_placement"][1]
    assert errors["to_partial"][0] == "RuntimeError" and "from R to P(sum)" in errors["to_partial"][1]
    assert errors["no_rule"][0] == "NotImplementedError" and "aten.cumsum.default" in errors["no_rule"][1]
    assert errors["mixed"][0] == "RuntimeError" and "mixed torch.Tensor and DTensor" in errors["mixed"][1]
    assert errors["nested"][0] == "RuntimeError"
    assert errors["non_leaf"][0] == "RuntimeError" and "leaf" in errors["non_leaf"][1]
    assert errors["inplace_partial"][0] == "RuntimeError" and "aten.sqrt_.default" in errors["inplace_partial"][1]
    assert errors["fill_partial"][0] == "RuntimeError" and "aten.fill_.Scalar" in errors["fill_partial"][1]
    assert errors["other_mesh"][0] == "NotImplementedError" and "different meshes" in errors["other_mesh"][1]
    assert scalar.shape == (4, 4)
