"""``pt_dist.checkpoint.async_save`` and the deprecated ``save_state_dict`` / ``load_state_dict`` beside torch's in
the same 2 ranks (after torch's test/distributed/checkpoint/test_async_checkpoint... cases and the DCP async
recipe, pytorch/tutorials recipes_source/distributed_async_checkpoint_recipe.rst): the state dict is staged to a
CPU copy before ``async_save`` returns, so training may change the model while the copy is written (on a group
of the save's own); a checkpoint either library writes asynchronously loads in the other; a stager whose copy is a
Future gives an ``AsyncSaveResponse``; ``FileSystemWriter(cache_staged_state_dict=True)`` stages into one kept
copy; the deprecated calls warn and round-trip."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as tdcp
import torch.distributed.tensor as tt

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_device_mesh import _both_worlds  # noqa: E402
from test_dtensor import _close_up, _meshes  # noqa: E402


def _weights():
    return torch.arange(24.0).reshape(6, 4)


def _async(rank, world, root):
    import pt_dist
    import pt_dist.checkpoint as dcp
    import pt_dist.tensor as pt
    from pt_dist.checkpoint.staging import DefaultStager, StagingOptions
    from pt_dist.checkpoint.state_dict_saver import AsyncCheckpointerType

    _both_worlds(rank, world, "tcp")
    try:
        mesh, tmesh = _meshes((world,))
        out = {}
        save_pg, tsave_pg = pt_dist.new_group(), dist.new_group(backend="gloo")
        # ours, asynchronously, while this rank changes the model and runs a collective of its own meanwhile
        w = pt.distribute_tensor(_weights(), mesh, [pt.Shard(0)])
        fut = dcp.async_save({"w": w, "step": 3}, checkpoint_id=f"{root}/ours", process_group=save_pg)
        with torch.no_grad():
            w.to_local().add_(100.0)
        t = torch.ones(2)
        pt_dist.all_reduce(t)
        out["ours future"] = (type(fut).__name__, type(fut.result()).__name__, t)
        # torch's, likewise
        tw = tt.distribute_tensor(_weights(), tmesh, [tt.Shard(0)])
        tfut = tdcp.async_save({"w": tw, "step": 3}, checkpoint_id=f"{root}/theirs", process_group=tsave_pg)
        with torch.no_grad():
            tw.to_local().add_(100.0)
        tfut.result()
        # each loads the other's (into the other sharding)
        into_torch = {"w": tt.distribute_tensor(torch.zeros(6, 4), tmesh, [tt.Replicate()]), "step": 0}
        tdcp.load(into_torch, checkpoint_id=f"{root}/ours")
        into_ours = {"w": pt.distribute_tensor(torch.zeros(6, 4), mesh, [pt.Replicate()]), "step": 0}
        dcp.load(into_ours, checkpoint_id=f"{root}/theirs")
        out["interchange"] = (into_torch["w"].full_tensor(), into_torch["step"], into_ours["w"].full_tensor(),
                              into_ours["step"])
        # a stager whose copy is a Future: AsyncSaveResponse, both
        kinds = []
        for lib, stager_mod, name in ((dcp, None, "ours_r"), (tdcp, "torch", "theirs_r")):
            if stager_mod is None:
                stager = DefaultStager(StagingOptions(False, False, True, False))
                sd = {"w": pt.distribute_tensor(_weights(), mesh, [pt.Shard(0)])}
                pg = save_pg
            else:
                from torch.distributed.checkpoint.staging import DefaultStager as TDS
                from torch.distributed.checkpoint.staging import StagingOptions as TSO
                stager = TDS(TSO(False, False, True, False))
                sd = {"w": tt.distribute_tensor(_weights(), tmesh, [tt.Shard(0)])}
                pg = tsave_pg
            resp = lib.async_save(sd, checkpoint_id=f"{root}/{name}", process_group=pg, async_stager=stager)
            resp.staging_completion.result()
            resp.upload_completion.result()
            stager.close()
            kinds.append(type(resp).__name__)
        out["response"] = kinds
        # a writer that caches its staged copy: the second save stages into the first's copy
        writer = dcp.FileSystemWriter(f"{root}/cached", cache_staged_state_dict=True)
        w = pt.distribute_tensor(_weights(), mesh, [pt.Shard(0)])
        dcp.async_save({"w": w}, storage_writer=writer, process_group=save_pg).result()
        first = writer.state_dict_cache
        with torch.no_grad():
            w.to_local().mul_(-1.0)
        dcp.async_save({"w": w}, checkpoint_id=f"{root}/cached2", storage_writer=writer,
                       process_group=save_pg).result()
        back = {"w": pt.distribute_tensor(torch.zeros(6, 4), mesh, [pt.Replicate()])}
        dcp.load(back, checkpoint_id=f"{root}/cached2")
        out["cached"] = (writer.state_dict_cache is first, back["w"].full_tensor())
        # the deprecated pair
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dcp.save_state_dict({"w": w}, dcp.FileSystemWriter(f"{root}/old"))
            back = {"w": pt.distribute_tensor(torch.zeros(6, 4), mesh, [pt.Replicate()])}
            dcp.load_state_dict(back, dcp.FileSystemReader(f"{root}/old"))
        out["deprecated"] = ([type(c.message).__name__ for c in caught if "deprecated" in str(c.message)],
                             back["w"].full_tensor())
        try:
            dcp.async_save({"w": w}, checkpoint_id=f"{root}/p", async_checkpointer_type=AsyncCheckpointerType.PROCESS)
            out["process"] = "saved"
        except ValueError as e:
            out["process"] = str(e)
        return out
    finally:
        _close_up()


def test_async_save_stages_then_writes_and_interchanges_with_torch(tmp_path):
    for out in run_ranks(_async, 2, str(tmp_path), backend=None, timeout=180):
        assert out["ours future"][:2] == ("Future", "Metadata") and torch.equal(out["ours future"][2],
                                                                                 torch.full((2,), 2.0))
        from_ours, step, from_theirs, t_step = out["interchange"]
        # both hold the values of when async_save was called, not the +100 made right after it
        assert torch.equal(from_ours, _weights()) and torch.equal(from_theirs, _weights()) and step == t_step == 3
        assert out["response"] == ["AsyncSaveResponse", "AsyncSaveResponse"]
        same, second = out["cached"]
        assert same and torch.equal(second, -_weights())
        kinds, back = out["deprecated"]
        assert kinds == ["FutureWarning", "FutureWarning"] and torch.equal(back, -_weights())
        assert "AsyncCheckpointerType.PROCESS" in out["process"]
