"""``checkpoint.load_sharded_optimizer_state_dict`` as torch's FSDP1 checkpoint example uses it
(torch/distributed/checkpoint/examples/fsdp_checkpoint_example.py, torch's
test/distributed/checkpoint/test_fsdp_optim_state.py): under ``SHARDED_STATE_DICT`` save ``{"model":
model.state_dict(), "optim": FSDP.optim_state_dict(model, optim)}``, load the model into a fresh one, read the
optimizer state back laid out as the model's, ``FSDP.optim_state_dict_to_load`` it; the resumed run's next Adam
step equals the uninterrupted one's, for pt_dist and for torch in the same 2 ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import leave  # noqa: E402
from test_device_mesh import _both_worlds  # noqa: E402


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))


def _step(model, optim, rank, i):
    loss = model(torch.randn(4, 5, generator=torch.Generator().manual_seed(10 * i + rank))).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    return loss.item()


def _resume(fsdp_mod, dcp, kw, path, rank):
    fsdp, sharded = fsdp_mod.FullyShardedDataParallel, fsdp_mod.StateDictType.SHARDED_STATE_DICT
    model = fsdp(_model(0), **kw)
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    _step(model, optim, rank, 0)
    with fsdp.state_dict_type(model, sharded):
        dcp.save({"model": model.state_dict(), "optim": fsdp.optim_state_dict(model, optim)},
                 storage_writer=dcp.FileSystemWriter(path))
    going_on = [_step(model, optim, rank, i) for i in (1, 2)]
    fresh = fsdp(_model(1), **kw)
    fresh_optim = torch.optim.Adam(fresh.parameters(), lr=0.01)
    with fsdp.state_dict_type(fresh, sharded):
        state = {"model": fresh.state_dict()}
        dcp.load(state, storage_reader=dcp.FileSystemReader(path))
        fresh.load_state_dict(state["model"])
        osd = dcp.load_sharded_optimizer_state_dict(model_state_dict=state["model"], optimizer_key="optim",
                                                    storage_reader=dcp.FileSystemReader(path))
        fresh_optim.load_state_dict(fsdp.optim_state_dict_to_load(fresh, fresh_optim, osd["optim"]))
    resumed = [_step(fresh, fresh_optim, rank, i) for i in (1, 2)]
    with fsdp.summon_full_params(fresh):
        return going_on, resumed, sorted(osd["optim"]), [p.detach().clone() for p in fresh.parameters()]


def _both(rank, world, root):
    import pt_dist.checkpoint as ours_dcp
    import pt_dist.fsdp as ours
    import torch.distributed.checkpoint as theirs_dcp
    import torch.distributed.fsdp as theirs

    _both_worlds(rank, world, "tcp")
    try:
        return (_resume(ours, ours_dcp, {}, f"{root}/ours", rank),
                _resume(theirs, theirs_dcp, {"device_id": torch.device("cpu")}, f"{root}/theirs", rank))
    finally:
        leave()
        dist.destroy_process_group()


def test_load_sharded_optimizer_state_dict_resumes_fsdp1_as_torchs(tmp_path):
    for (going_on, resumed, keys, params), (t_going_on, t_resumed, t_keys, t_params) in run_ranks(
            _both, 2, str(tmp_path), backend=None, timeout=180):
        assert keys == t_keys == ["param_groups", "state"]
        assert resumed == going_on, (resumed, going_on)  # the resumed Adam steps are the uninterrupted ones
        assert torch.allclose(torch.tensor(going_on), torch.tensor(t_going_on), rtol=1e-5)
        assert torch.allclose(torch.tensor(resumed), torch.tensor(t_resumed), rtol=1e-5)
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, t_params))


def test_find_tensor_shard_and_resolve_bytes_as_torchs():
    """checkpoint.utils.find_tensor_shard (a plain tensor at the origin is itself, at another offset an error
    naming it) and LoadPlanner.resolve_bytes (optional: NotImplementedError unless a planner gives it), beside
    torch's."""
    import pt_dist.checkpoint as ours
    import torch.distributed.checkpoint as theirs
    from pt_dist.checkpoint.utils import find_tensor_shard
    from torch.distributed.checkpoint.utils import find_tensor_shard as torch_find_tensor_shard

    t = torch.ones(3)
    for find, lib in ((find_tensor_shard, ours), (torch_find_tensor_shard, theirs)):
        assert find(t, lib.metadata.MetadataIndex("w", torch.Size([0]))) is t
        with pytest.raises(ValueError, match="can't find by offset"):
            find(t, lib.metadata.MetadataIndex("w", torch.Size([1])))
        planner = lib.DefaultLoadPlanner()
        with pytest.raises(NotImplementedError, match="resolve_bytes"):
            planner.resolve_bytes(None)
