"""FSDP state dicts and sharded checkpoints on tcp, shm and gloo: the full state dict (rank 0 only) loads into the
plain model and computes what FSDP computes; torch's ``FSDP.state_dict_type`` spelling; a sharded checkpoint
(``pt_dist.checkpoint.save`` / ``load``, each rank its file, written atomically) round-trips and resuming from it
continues the same loss curve; incomplete, mixed and wrong-world-size checkpoints are refused on every rank."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import checkpoint
from pt_dist.fsdp import (
    FullStateDictConfig,
    FullyShardedDataParallel,
    ModuleWrapPolicy,
    StateDictType,
)

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ddp_testutil as dutil  # noqa: E402
import ptdist_testutil as util  # noqa: E402


def _model(seed=0):
    torch.manual_seed(seed)
    model = dutil.stack()
    model.register_buffer("seen", torch.zeros(()))  # a buffer rides along in every state dict
    model.register_buffer("scratch", torch.ones(2), persistent=False)  # ... a non-persistent one in none
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}))


def _train(fsdp, opt, rank, world, steps):
    losses = []
    for step in steps:
        xs, ys = dutil.batches(world, step)
        loss = dutil.mse(fsdp, xs[rank], ys[rank], rank)
        loss.backward()
        opt.step()
        opt.zero_grad()
        t = loss.detach().reshape(1)
        pt_dist.all_reduce(t)
        losses.append(t.item())
    return losses


def _raises(fn) -> str:
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return str(e)
    return "no error"


def _checkpoints(rank, world, backend, root):
    util.join(rank, world, backend, timeout=60)
    out = {}
    try:
        fsdp = _model()
        opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
        _train(fsdp, opt, rank, world, range(3))
        # the full state dict, gathered on rank 0 only, loads into the plain model
        with FullyShardedDataParallel.state_dict_type(
            fsdp, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        ):
            full = fsdp.state_dict()
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(9))
        with torch.no_grad():
            out["fsdp output"] = fsdp(x)
        if rank == 0:
            plain = dutil.stack()
            plain.register_buffer("seen", torch.zeros(()))
            out["load into plain"] = str(plain.load_state_dict(full, strict=True))
            with torch.no_grad():
                out["plain output"] = plain(x)
        out["full keys"] = len(full)
        # a sharded checkpoint, then three more steps
        d = Path(root) / "ckpt"
        with FullyShardedDataParallel.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
            sharded = fsdp.state_dict()
        out["sharded keys"] = sorted(sharded)
        checkpoint.save({"model": sharded, "optim": opt.state_dict()}, d)
        out["files"] = sorted(os.listdir(d))
        out["continued"] = _train(fsdp, opt, rank, world, range(3, 6))
        # resume into a model initialised differently, through torch's spelling again
        again = _model(seed=1)
        opt2 = torch.optim.AdamW(again.parameters(), lr=1e-2)
        state = {"model": again.sharded_state_dict(), "optim": opt2.state_dict()}
        checkpoint.load(state, d)
        with FullyShardedDataParallel.state_dict_type(again, StateDictType.SHARDED_STATE_DICT):
            again.load_state_dict(state["model"])
        opt2.load_state_dict(state["optim"])
        out["resumed"] = _train(again, opt2, rank, world, range(3, 6))
        # a full state dict every rank holds loads into an FSDP model (each rank keeps its shard)
        every = fsdp.full_state_dict()
        third = _model(seed=2)
        third.load_state_dict(every)
        out["full round trip"] = all(torch.equal(v, third.full_state_dict()[k]) for k, v in every.items())
        # refusals, on every rank
        if rank == 0:
            (d / ".metadata").rename(d / "metadata.aside")
        pt_dist.barrier()
        out["incomplete"] = _raises(lambda: checkpoint.load({}, d))
        if rank == 0:
            (d / "metadata.aside").rename(d / ".metadata")
        d2 = Path(root) / "ckpt2"
        checkpoint.save({"model": fsdp.sharded_state_dict()}, d2)
        if rank == 0:
            shutil.copy(d / "__1_0.distcp", d2 / "__1_0.distcp")  # a rank file of the earlier save
        pt_dist.barrier()
        out["mixed"] = _raises(lambda: checkpoint.load({}, d2))
        solo = pt_dist.new_group([rank], use_local_synchronization=True)
        out["world"] = _raises(lambda: checkpoint.load({}, d, process_group=solo))
        wrong = FullyShardedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(6, 5), dutil.Block(), torch.nn.Linear(12, 3)),
            auto_wrap_policy=ModuleWrapPolicy({dutil.Block}),
        )
        out["shape"] = _raises(lambda: wrong.load_sharded_state_dict(sharded, strict=False))
        return out
    finally:
        util.leave()


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_full_and_sharded_state_dicts_and_resuming_from_a_sharded_checkpoint(backend, tmp_path):
    r0, r1 = run_ranks(_checkpoints, 2, backend, str(tmp_path), backend=None, timeout=120)
    assert r0["load into plain"] == "<All keys matched successfully>"
    assert torch.allclose(r0["plain output"], r0["fsdp output"], atol=1e-6)
    assert r0["full keys"] == len(dutil.stack().state_dict()) + 1 and r1["full keys"] == 0  # rank0_only
    assert r0["sharded keys"] == ["1._flat_param", "2._flat_param", "3._flat_param", "_flat_param", "seen"]
    assert r0["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # nothing temporary left
    for out in (r0, r1):
        assert out["resumed"] == out["continued"], (out["resumed"], out["continued"])  # the same loss curve
        assert out["full round trip"]
        assert "no complete checkpoint" in out["incomplete"] and ".metadata missing" in out["incomplete"]
        assert "rank 1: " in out["mixed"] and "belongs to another save" in out["mixed"]
        assert "saved by 2 ranks, loaded by 1" in out["world"]
        assert "'_flat_param' has shape" in out["shape"] and "different number of ranks" in out["shape"]
