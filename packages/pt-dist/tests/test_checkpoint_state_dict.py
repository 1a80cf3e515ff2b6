"""``pt_dist.checkpoint.state_dict`` next to torch's, in the same ranks (torch's default group on gloo, pt_dist's
world on tcp), after torch's test/distributed/checkpoint/test_state_dict.py: DDP and FSDP1 models trained alike
give the same FQNs and values from ``get_state_dict`` (model and optimizer, sharded and ``full_state_dict``; FSDP1's
sharded parameters the same local rows as torch's ShardedTensors); checkpoints cross between the two
implementations (pt_dist's ``save`` of DTensors -> torch's ``dcp.load`` into torch DTensors of another sharding,
and back; pt_dist's FSDP1 checkpoint -> torch's FSDP1 through torch's ``set_state_dict``, and back: the loaded
model computes what the saved one did); and a DDP checkpoint of 2 ranks loads into a 1-rank FSDP1 model, an FSDP1
one into a plain module, with ``broadcast_from_rank0`` and ``cpu_offload`` on the way."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pt_dist
import torch
import torch.distributed as dist
from pt_dist import checkpoint as dcp
from pt_dist.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from pt_dist.device_mesh import init_device_mesh
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.tensor import DTensor, Shard, distribute_tensor
from torch import nn

import harness
from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import join, leave  # noqa: E402

X = torch.randn(4, 6, generator=torch.Generator().manual_seed(7))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Sequential(nn.Linear(7, 5), nn.Tanh()), nn.Linear(5, 3))


def _train(model, optim, rank, steps=2):
    for i in range(steps):
        optim.zero_grad()
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * rank + i))
        model(x).square().mean().backward()
        optim.step()


def _out(model):
    with torch.no_grad():
        return model(X)


def _both_worlds(rank, world):
    if rank == 0:  # torch's default group first (gloo), so pt_dist's world does not become torch's
        store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
        harness.store().set("cksd_port", str(store.port))
    else:
        store = dist.TCPStore("127.0.0.1", int(harness.store().get("cksd_port")), world,
                              timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    join(rank, world, "tcp", timeout=60, key="cksd_pt")
    return store


def _same(a: dict, b: dict, path="") -> list:
    """Where two (nested) state dicts differ: keys, or values beyond 1e-6."""
    if sorted(map(str, a)) != sorted(map(str, b)):
        return [f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"]
    bad = []
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            bad += _same(x, y, f"{path}{k}.")
        elif isinstance(x, list) and x and isinstance(x[0], dict):
            for i, (u, v) in enumerate(zip(x, y)):
                bad += _same(u, v, f"{path}{k}.{i}.")
        elif isinstance(x, torch.Tensor):
            if x.shape != y.shape or not torch.allclose(x.double(), y.double(), atol=1e-6):
                bad.append(f"{path}{k}")
        elif x != y:
            bad.append(f"{path}{k}: {x!r} vs {y!r}")
    return bad


def _local(v):
    """This rank's rows: a DTensor's local tensor (pt_dist's or torch's), a ShardedTensor's one local shard."""
    if isinstance(v, DTensor) or hasattr(v, "to_local"):
        return v.to_local()
    if hasattr(v, "local_shards"):
        return v.local_shards()[0].tensor
    return v


def _side_by_side(rank, world, root):
    import torch.distributed.checkpoint as torch_dcp
    from torch.distributed.checkpoint import state_dict as tsd
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor as tdistribute

    store = _both_worlds(rank, world)
    out = {}
    try:
        full = StateDictOptions(full_state_dict=True)
        # DDP: the same FQNs (no "module.") and values, model and optimizer
        theirs, ours = torch.nn.parallel.DistributedDataParallel(_net()), pt_dist.DistributedDataParallel(_net())
        opt_t, opt_o = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (theirs, ours))
        _train(theirs, opt_t, rank)
        _train(ours, opt_o, rank)
        t_msd, t_osd = tsd.get_state_dict(theirs, opt_t)
        o_msd, o_osd = get_state_dict(ours, opt_o)
        out["ddp keys"] = sorted(o_msd)
        out["ddp sizes"] = (len(o_osd["state"]), len(o_osd["state"]["0.weight"]), len(o_osd["param_groups"]))
        out["ddp diff"] = _same(t_msd, o_msd) + _same(t_osd, o_osd)
        dcp.save({"model": o_msd, "optim": o_osd}, checkpoint_id=f"{root}/ddp")
        out["ddp output"] = _out(ours)
        # FSDP1: sharded, the same FQNs and the same local rows; full, the same values
        theirs = TorchFSDP(_net(), device_id=torch.device("cpu"))
        ours = FSDP(_net())
        opt_t, opt_o = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (theirs, ours))
        _train(theirs, opt_t, rank)
        _train(ours, opt_o, rank)
        t_msd, o_msd = tsd.get_model_state_dict(theirs), get_model_state_dict(ours)
        out["fsdp keys"] = (sorted(t_msd), sorted(o_msd))
        out["fsdp rows"] = [k for k in t_msd if not torch.allclose(_local(t_msd[k]), _local(o_msd[k]), atol=1e-6)]
        out["fsdp full sizes"] = (len(get_model_state_dict(ours, options=full)),
                                  len(get_optimizer_state_dict(ours, opt_o, options=full)["state"]))
        out["fsdp full diff"] = (_same(tsd.get_model_state_dict(theirs, options=full),
                                       get_model_state_dict(ours, options=full))
                                 + _same(tsd.get_optimizer_state_dict(theirs, opt_t, options=full),
                                         get_optimizer_state_dict(ours, opt_o, options=full)))
        out["fsdp output"] = _out(ours)
        # pt_dist's FSDP1 checkpoint -> torch's FSDP1 (torch's dcp.load, torch's set_state_dict), and back
        msd, osd = get_state_dict(ours, opt_o)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{root}/fsdp")
        torch_fresh = TorchFSDP(_net(), device_id=torch.device("cpu"))
        torch_opt = torch.optim.Adam(torch_fresh.parameters(), lr=1e-2)
        tm, to = tsd.get_state_dict(torch_fresh, torch_opt)
        torch_dcp.load({"model": tm, "optim": to}, checkpoint_id=f"{root}/fsdp")
        tsd.set_state_dict(torch_fresh, torch_opt, model_state_dict=tm, optim_state_dict=to)
        out["torch loads ours: output"] = _out(torch_fresh)
        _train(torch_fresh, torch_opt, rank, 1)
        _train(ours, opt_o, rank, 1)
        out["torch loads ours: next step"] = (_out(torch_fresh), _out(ours))
        tm, to = tsd.get_state_dict(theirs, opt_t)
        torch_dcp.save({"model": tm, "optim": to}, checkpoint_id=f"{root}/torch_fsdp")
        fresh = FSDP(_net())
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
        msd, osd = get_state_dict(fresh, fresh_opt)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=f"{root}/torch_fsdp")
        set_state_dict(fresh, fresh_opt, model_state_dict=msd, optim_state_dict=osd)
        out["ours loads torch: output"] = (_out(fresh), _out(theirs))
        _train(fresh, fresh_opt, rank, 1)
        _train(theirs, opt_t, rank, 1)
        out["ours loads torch: next step"] = (_out(fresh), _out(theirs))
        # bare DTensors: saved as rows by one implementation, loaded as columns by the other
        mesh = init_device_mesh("cpu", (2,))
        tmesh = torch_mesh("cpu", (2,))
        g = torch.Generator().manual_seed(5)
        values = {"w": torch.randn(7, 6, generator=g), "v": torch.randn(5, generator=g)}
        dcp.save({k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in values.items()}, checkpoint_id=f"{root}/dt")
        tgt = {k: tdistribute(torch.zeros_like(v), tmesh, [TShard(v.dim() - 1)]) for k, v in values.items()}
        torch_dcp.load(tgt, checkpoint_id=f"{root}/dt")
        out["torch reads our DTensors"] = all(torch.equal(tgt[k].full_tensor(), v) for k, v in values.items())
        torch_dcp.save({k: tdistribute(v, tmesh, [TShard(0)]) for k, v in values.items()},
                       checkpoint_id=f"{root}/tdt")
        tgt = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(v.dim() - 1)]) for k, v in values.items()}
        dcp.load(tgt, checkpoint_id=f"{root}/tdt")
        out["we read torch's DTensors"] = all(torch.equal(tgt[k].full_tensor(), v) for k, v in values.items())
        # full_state_dict + cpu_offload: rank 0 alone; broadcast_from_rank0 hands it to every rank's FSDP1 unit
        offload = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd, osd = get_model_state_dict(ours, options=offload), get_optimizer_state_dict(ours, opt_o, options=offload)
        out["rank 0 only"] = (len(msd), len(osd))
        again = FSDP(_net())
        again_opt = torch.optim.Adam(again.parameters(), lr=1e-2)
        bcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(again, msd, options=bcast)
        set_optimizer_state_dict(again, again_opt, osd, options=bcast)
        _train(again, again_opt, rank, 1)
        _train(ours, opt_o, rank, 1)
        out["broadcast from rank 0: next step"] = (_out(again), _out(ours))
        return out
    finally:
        leave()
        dist.destroy_process_group()
        del store


def _load_at_1(rank, world, root):
    join(rank, 1, "tcp", timeout=60, key="cksd_one")
    try:
        # the 2-rank DDP checkpoint into a 1-rank FSDP1 model
        fsdp = FSDP(_net())
        opt = torch.optim.Adam(fsdp.parameters(), lr=1e-2)
        msd, osd = get_state_dict(fsdp, opt)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=f"{root}/ddp")
        set_state_dict(fsdp, opt, model_state_dict=msd, optim_state_dict=osd)
        # the 2-rank FSDP1 checkpoint (DTensor rows) into a plain module
        plain = _net()
        plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
        msd, osd = get_state_dict(plain, plain_opt)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=f"{root}/fsdp")
        set_state_dict(plain, plain_opt, model_state_dict=msd, optim_state_dict=osd)
        return _out(fsdp), _out(plain), sorted(osd["state"])
    finally:
        leave()


def test_state_dicts_match_torchs_and_checkpoints_cross_implementations_and_world_sizes(tmp_path):
    results = run_ranks(_side_by_side, 2, str(tmp_path), backend=None, timeout=240)
    for rank, out in enumerate(results):
        assert out["ddp keys"] == sorted(_net().state_dict()), out["ddp keys"]  # no "module." prefix
        assert out["ddp diff"] == [], (rank, out["ddp diff"])
        assert out["ddp sizes"] == (6, 3, 1)  # (what was compared: 6 parameters' step, exp_avg, exp_avg_sq)
        assert out["fsdp full sizes"] == (6, 6)
        theirs, ours = out["fsdp keys"]
        assert theirs == ours == sorted(_net().state_dict())
        assert out["fsdp rows"] == [] and out["fsdp full diff"] == [], (out["fsdp rows"], out["fsdp full diff"])
        assert torch.allclose(out["torch loads ours: output"], out["fsdp output"], atol=1e-6)
        assert torch.allclose(*out["torch loads ours: next step"], atol=1e-5)  # the optimizer state came along
        assert torch.allclose(*out["ours loads torch: output"], atol=1e-6)
        assert torch.allclose(*out["ours loads torch: next step"], atol=1e-5)
        assert out["torch reads our DTensors"] and out["we read torch's DTensors"]
        assert torch.allclose(*out["broadcast from rank 0: next step"], atol=1e-6)
    assert results[0]["rank 0 only"][0] > 0 and results[1]["rank 0 only"] == (0, 0)
    [(fsdp_out, plain_out, optim_keys)] = run_ranks(_load_at_1, 1, str(tmp_path), backend=None, timeout=120)
    assert torch.allclose(fsdp_out, results[0]["ddp output"], atol=1e-6)  # DDP (2 ranks) -> FSDP1 (1 rank)
    assert torch.allclose(plain_out, results[0]["fsdp output"], atol=1e-6)  # FSDP1 (2 ranks) -> plain module
    assert optim_keys == sorted(n for n, p in _net().named_parameters())


def _fully_shard(model, shard):
    for layer in (model[0], model[2][0], model[3]):
        shard(layer)
    return shard(model)


def _fsdp2_side_by_side(rank, world, root):
    import torch.distributed.checkpoint as torch_dcp
    from pt_dist.fsdp import fully_shard
    from torch.distributed.checkpoint import state_dict as tsd
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    store = _both_worlds(rank, world)
    out = {}
    try:
        theirs, ours = _fully_shard(_net(), torch_fully_shard), _fully_shard(_net(), fully_shard)
        opt_t, opt_o = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (theirs, ours))
        _train(theirs, opt_t, rank)
        _train(ours, opt_o, rank)
        t_msd, t_osd = tsd.get_state_dict(theirs, opt_t)
        o_msd, o_osd = get_state_dict(ours, opt_o)
        local = {k: _local(v) for k, v in o_msd.items()}
        out["types"] = sorted({type(v).__name__ for v in o_msd.values()})
        out["diff"] = (_same({k: _local(v) for k, v in t_msd.items()}, local)
                       + _same({k: {n: _local(x) for n, x in s.items()} for k, s in t_osd["state"].items()},
                               {k: {n: _local(x) for n, x in s.items()} for k, s in o_osd["state"].items()}))
        out["sizes"] = (len(local), len(o_osd["state"]))
        out["output"] = _out(ours)
        dcp.save({"model": o_msd, "optim": o_osd}, checkpoint_id=f"{root}/fsdp2")
        # torch's fully_shard reads it (torch's dcp.load + set_state_dict) and takes the same next step
        torch_fresh = _fully_shard(nn.Sequential(*_net()), torch_fully_shard)
        torch_opt = torch.optim.Adam(torch_fresh.parameters(), lr=1e-2)
        tm, to = tsd.get_state_dict(torch_fresh, torch_opt)
        torch_dcp.load({"model": tm, "optim": to}, checkpoint_id=f"{root}/fsdp2")
        tsd.set_state_dict(torch_fresh, torch_opt, model_state_dict=tm, optim_state_dict=to)
        # the FSDP2 example's way back: full state on rank 0 (cpu_offload), broadcast_from_rank0 into a model on
        # the meta device
        offload = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full_m, full_o = get_model_state_dict(ours, options=offload), get_optimizer_state_dict(ours, opt_o,
                                                                                                options=offload)
        out["rank 0 only"] = (len(full_m), len(full_o))
        with torch.device("meta"):  # (the example's model: built on meta, sharded, then loaded)
            again = nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Sequential(nn.Linear(7, 5), nn.Tanh()),
                                  nn.Linear(5, 3))
        again = _fully_shard(again, fully_shard)
        bcast = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(again, full_m, options=bcast)  # (assigned: the optimizer comes after, as there)
        again_opt = torch.optim.Adam(again.parameters(), lr=1e-2)
        set_optimizer_state_dict(again, again_opt, full_o, options=bcast)
        for model, optim in ((torch_fresh, torch_opt), (ours, opt_o), (again, again_opt)):
            _train(model, optim, rank, 1)
        out["next step"] = [_out(m) for m in (torch_fresh, ours, again)]
        return out
    finally:
        leave()
        dist.destroy_process_group()
        del store


def _fsdp2_into_plain(rank, world, root):
    join(rank, 1, "tcp", timeout=60, key="cksd_plain")
    try:
        plain = _net()
        plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
        msd, osd = get_state_dict(plain, plain_opt)
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=f"{root}/fsdp2")
        set_state_dict(plain, plain_opt, model_state_dict=msd, optim_state_dict=osd)
        return _out(plain)
    finally:
        leave()


def test_fully_shard_state_dicts_match_torchs_and_load_into_torch_and_into_a_plain_module(tmp_path):
    results = run_ranks(_fsdp2_side_by_side, 2, str(tmp_path), backend=None, timeout=240)
    for out in results:
        assert out["types"] == ["DTensor"] and out["sizes"] == (6, 6)
        assert out["diff"] == [], out["diff"]  # each rank's rows of every parameter and Adam state, as torch's
        torch_next, ours_next, again_next = out["next step"]
        assert torch.allclose(torch_next, ours_next, atol=1e-5) and torch.allclose(again_next, ours_next, atol=1e-6)
    assert results[0]["rank 0 only"][0] == 6 and results[1]["rank 0 only"] == (0, 0)
    [plain_out] = run_ranks(_fsdp2_into_plain, 1, str(tmp_path), backend=None, timeout=120)
    assert torch.allclose(plain_out, results[0]["output"], atol=1e-6)  # fully_shard (2 ranks) -> plain module
