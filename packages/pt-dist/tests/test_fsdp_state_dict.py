"""FSDP state dicts and sharded checkpoints on tcp, shm and gloo: the full state dict (rank 0 only) loads into the
plain model and computes what FSDP computes; torch's ``FSDP.state_dict_type`` spelling (``SHARDED_STATE_DICT``:
one DTensor per parameter, under the plain names); a sharded checkpoint (``pt_dist.checkpoint.save`` / ``load``
of ``get_state_dict``'s, each rank its file, written atomically) round-trips and resuming from it continues the
same loss curve; it also loads at another world size (1 rank, into plain tensors); incomplete and mixed
checkpoints are refused on every rank."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import checkpoint
from pt_dist.checkpoint.state_dict import get_state_dict, set_state_dict
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
    except (ValueError, RuntimeError, checkpoint.CheckpointException) as e:
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
        out["sharded types"] = sorted({type(v).__name__ for v in sharded.values()})
        at_save = fsdp.full_state_dict()
        model_sd, optim_sd = get_state_dict(fsdp, opt)
        checkpoint.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=d)
        out["files"] = sorted(os.listdir(d))
        out["continued"] = _train(fsdp, opt, rank, world, range(3, 6))
        # resume into a model initialised differently
        again = _model(seed=1)
        opt2 = torch.optim.AdamW(again.parameters(), lr=1e-2)
        model_sd, optim_sd = get_state_dict(again, opt2)
        state = {"model": model_sd, "optim": optim_sd}
        checkpoint.load(state, checkpoint_id=d)
        set_state_dict(again, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
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
        out["incomplete"] = _raises(lambda: checkpoint.load({"model": again.sharded_state_dict()}, checkpoint_id=d))
        if rank == 0:
            (d / "metadata.aside").rename(d / ".metadata")
        d2 = Path(root) / "ckpt2"
        checkpoint.save({"model": fsdp.sharded_state_dict()}, checkpoint_id=d2)
        if rank == 0:  # rank 1's file of the earlier save under this save's name
            old, new = (sorted(p for p in x.iterdir() if p.name.startswith("__1_"))[0] for x in (d, d2))
            shutil.copy(old, new)
        pt_dist.barrier()
        out["mixed"] = _raises(lambda: checkpoint.load({"model": again.sharded_state_dict()}, checkpoint_id=d2))
        # one rank alone loads what two saved, into plain tensors
        solo = pt_dist.new_group([rank], use_local_synchronization=True)
        plain = {f"model.{k}": torch.zeros_like(v) for k, v in at_save.items()}
        checkpoint.load(plain, checkpoint_id=d, process_group=solo)
        out["one rank"] = all(torch.equal(plain[f"model.{k}"], v) for k, v in at_save.items())
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
    assert r0["sharded keys"] == sorted(dutil.stack().state_dict()) + ["seen"]  # the plain names, as torch's
    assert r0["sharded types"] == ["DTensor", "Tensor"]  # parameters sharded, the buffer plain
    assert r0["files"][0] == ".metadata" and len(r0["files"]) == 3  # nothing temporary left
    assert [f.split("_")[2] for f in r0["files"][1:]] == ["0", "1"]  # __<rank>_<save token>_0.distcp
    for out in (r0, r1):
        assert out["resumed"] == out["continued"], (out["resumed"], out["continued"])  # the same loss curve
        assert out["full round trip"]
        assert "no complete checkpoint" in out["incomplete"] and ".metadata missing" in out["incomplete"]
        assert "RANK 1" in out["mixed"] and "is corrupt" in out["mixed"] and "__1_" in out["mixed"]
        assert out["one rank"]
        assert "has shape" in out["shape"]
