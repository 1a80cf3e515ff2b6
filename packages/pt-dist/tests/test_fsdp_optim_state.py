"""FSDP optimizer state dicts (issue 34, defect 5), after torch's test/distributed/fsdp/test_fsdp_optim_state.py:
``FSDP.optim_state_dict`` against torch's own FSDP1 trained the same way in the same ranks (torch's FSDP runs on
CPU with ``device_id=cpu`` over a gloo group), keys and values; ``optim_state_dict_to_load`` round trips, also at
another world size (saved on 2 ranks, loaded into a 1-rank FSDP model: the next step equals the uninterrupted
one); under ``SHARDED_STATE_DICT`` (torch's ``_sharded_optim_state_dict`` cases) each rank's rows of every
per-element state equal torch's ShardedTensor's local shard, and loading them back restores the optimizer
exactly; bad input named."""

from __future__ import annotations

import copy
import datetime
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
import torch.distributed as dist
from pt_dist.fsdp import FullOptimStateDictConfig, StateDictType
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from torch import nn

import harness
from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import join, leave  # noqa: E402


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Sequential(nn.Linear(7, 5), nn.Tanh()), nn.Linear(5, 3))


def _batch(rank, i):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * rank + i))


def _train(model, optim, rank, steps, start=0):
    for i in range(start, start + steps):
        optim.zero_grad()
        model(_batch(rank, i)).square().mean().backward()
        optim.step()


def _ours(pg):
    model = _net()
    model[2] = FSDP(model[2], process_group=pg)
    return FSDP(model, process_group=pg)


def _local(v):
    """The rows a rank holds of a sharded state (torch's ShardedTensor or a DTensor); anything else as is."""
    if hasattr(v, "local_tensor"):
        return v.local_tensor().clone()
    if hasattr(v, "to_local"):
        return v.to_local().clone()
    return v


def _sharded_case(theirs, opt_t, ours, opt_o):
    """SHARDED_STATE_DICT on both sides: the local rows, our value types, and our sharded round trip."""
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
    from torch.distributed.fsdp import StateDictType as TorchType

    with TorchFSDP.state_dict_type(theirs, TorchType.SHARDED_STATE_DICT):
        sh_t = TorchFSDP.optim_state_dict(theirs, opt_t)
    with FSDP.state_dict_type(ours, StateDictType.SHARDED_STATE_DICT):
        sh_o = FSDP.optim_state_dict(ours, opt_o)
    model = _ours(pt_dist.group.WORLD)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, sh_o))
    want, got = opt_o.state_dict()["state"], opt.state_dict()["state"]
    round_trip = sorted(got) == sorted(want) and all(torch.equal(got[i][k], v) for i, st in want.items()
                                                     for k, v in st.items())
    local = [{n: {k: _local(v) for k, v in st.items()} for n, st in sd["state"].items()} for sd in (sh_t, sh_o)]
    kinds = {type(v).__name__ for st in sh_o["state"].values() for v in st.values()}
    return (*local, kinds, round_trip)


def _parity(rank, world, backend):
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP

    if rank == 0:  # torch's default group first (gloo), so pt_dist's world does not become torch's
        tstore = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                               timeout=datetime.timedelta(seconds=60))
        harness.store().set("os_port", str(tstore.port))
    else:
        tstore = dist.TCPStore("127.0.0.1", int(harness.store().get("os_port")), world,
                               timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=tstore, rank=rank, world_size=world)
    join(rank, world, backend, timeout=60, key="os_pt")
    try:
        theirs = _net()
        theirs[2] = TorchFSDP(theirs[2], device_id=torch.device("cpu"))
        theirs = TorchFSDP(theirs, device_id=torch.device("cpu"))
        ours = _ours(pt_dist.group.WORLD)
        opt_t, opt_o = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (theirs, ours))
        _train(theirs, opt_t, rank, 2)
        _train(ours, opt_o, rank, 2)
        osd_t = TorchFSDP.optim_state_dict(theirs, opt_t)
        osd_o = FSDP.optim_state_dict(ours, opt_o)
        sharded_case = _sharded_case(theirs, opt_t, ours, opt_o)
        loaded_model = _ours(pt_dist.group.WORLD)
        loaded_opt = torch.optim.Adam(loaded_model.parameters(), lr=1e-2)
        with torch.no_grad():
            for a, b in zip(loaded_model.parameters(), ours.parameters()):
                a.copy_(b)
        loaded_opt.load_state_dict(FSDP.optim_state_dict_to_load(loaded_model, loaded_opt, copy.deepcopy(osd_o)))
        _train(ours, opt_o, rank, 1, start=2)
        _train(loaded_model, loaded_opt, rank, 1, start=2)
        resumed = [torch.equal(a, b) for a, b in zip(loaded_model.parameters(), ours.parameters())]
        with FSDP.state_dict_type(ours, StateDictType.FULL_STATE_DICT, None, FullOptimStateDictConfig(rank0_only=True)):
            rank0_only = FSDP.optim_state_dict(ours, opt_o)
        full_model = FSDP.state_dict(ours)
        # the older spellings, as torch's: full_optim_state_dict (rank 0 only by default) and
        # shard_full_optim_state_dict (without the optimizer: one group over model.parameters())
        legacy = (FSDP.full_optim_state_dict(ours, opt_o), TorchFSDP.full_optim_state_dict(theirs, opt_t))
        full = FSDP.full_optim_state_dict(ours, opt_o, rank0_only=False)
        sharded = FSDP.shard_full_optim_state_dict(full, ours)
        legacy += (sorted(sharded["state"]) == sorted(opt_o.state_dict()["state"]) and all(
            torch.equal(sharded["state"][i][k], v) for i, st in opt_o.state_dict()["state"].items()
            for k, v in st.items()),)
        return (osd_t, osd_o, resumed, bool(rank0_only), full_model, FSDP.optim_state_dict(ours, opt_o), legacy,
                sharded_case)
    finally:
        leave()
        dist.destroy_process_group()


def _reload_at_world_1(rank, world, full_model, osd):
    """A 1-rank FSDP model loads what 2 ranks saved (model and optimizer) and takes the same next step."""
    join(rank, world, "tcp", timeout=60, key="os_solo")
    try:
        model = _ours(pt_dist.group.WORLD)
        model.load_state_dict(full_model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, osd))
        with FSDP.summon_full_params(model, writeback=False):
            before = {n: p.clone() for n, p in model.named_parameters()}
        opt.zero_grad()
        x = torch.cat([_batch(r, 3) for r in range(2)])  # both ranks' batches: the 2-rank step's average
        model(x).square().mean().backward()
        opt.step()
        with FSDP.summon_full_params(model, writeback=False):
            after = {n: p.clone() for n, p in model.named_parameters()}
        bad = copy.deepcopy(osd)
        bad["state"].pop(sorted(bad["state"])[0])
        try:
            FSDP.optim_state_dict_to_load(model, opt, bad)
            refused = ""
        except ValueError as e:  # torch raises ValueError here too
            refused = str(e)
        return before, after, refused
    finally:
        leave()


def _two_rank_next_step(rank, world, full_model, osd):
    join(rank, world, "tcp", timeout=60, key="os_two")
    try:
        model = _ours(pt_dist.group.WORLD)
        model.load_state_dict(full_model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, osd))
        opt.zero_grad()
        model(_batch(rank, 3)).square().mean().backward()
        opt.step()
        with FSDP.summon_full_params(model, writeback=False):
            return {n: p.clone() for n, p in model.named_parameters()}
    finally:
        leave()


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_optim_state_dict_matches_torchs_fsdp_and_round_trips(backend):
    results = run_ranks(_parity, 2, backend, backend=None, timeout=180)
    for rank, (osd_t, osd_o, resumed, rank0_only, _, _, (ours_legacy, theirs_legacy, reshard),
               (rows_t, rows_o, kinds, sharded_round_trip)) in enumerate(results):
        assert bool(ours_legacy) == bool(theirs_legacy) == (rank == 0)  # rank0_only=True by default
        if rank == 0:
            assert sorted(ours_legacy["state"]) == sorted(theirs_legacy["state"])
        assert reshard  # shard_full_optim_state_dict gives back this rank's optimizer state exactly
        assert sorted(osd_o["state"]) == sorted(osd_t["state"])
        for name, st in osd_t["state"].items():
            assert sorted(st) == sorted(osd_o["state"][name]), name
            for k, v in st.items():
                torch.testing.assert_close(osd_o["state"][name][k], v, rtol=1e-5, atol=1e-6, msg=f"{name} {k}")
        assert [g["params"] for g in osd_o["param_groups"]] == [g["params"] for g in osd_t["param_groups"]]
        assert all(resumed), resumed
        assert rank0_only == (rank == 0)
        assert sorted(rows_o) == sorted(rows_t) and "DTensor" in kinds and sharded_round_trip, (kinds,)
        for name, st in rows_t.items():
            assert sorted(st) == sorted(rows_o[name]), name
            for k, v in st.items():
                torch.testing.assert_close(rows_o[name][k], v, rtol=1e-5, atol=1e-6, msg=f"sharded {name} {k}")


def test_a_full_optimizer_state_saved_on_2_ranks_loads_on_1():
    _, _, _, _, full_model, osd, _, _ = run_ranks(_parity, 2, "tcp", backend=None, timeout=180)[0]
    want = run_ranks(_two_rank_next_step, 2, full_model, osd, backend=None, timeout=120)[0]
    before, after, refused = run_ranks(_reload_at_world_1, 1, full_model, osd, backend=None, timeout=120)[0]
    for name, p in full_model.items():
        torch.testing.assert_close(before[name], p, rtol=0, atol=0)
        torch.testing.assert_close(after[name], want[name], rtol=1e-5, atol=1e-6)
    assert "no state for" in refused
