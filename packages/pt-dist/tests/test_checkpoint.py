"""``pt_dist.checkpoint.save`` / ``load`` across world sizes and shardings, after torch's
test/distributed/checkpoint/test_file_system_checkpoint.py (nested state dicts, objects, the file layout),
test_dtensor_resharding.py and e2e/test_e2e_save_and_load.py (saved at one world size, loaded at another): a
model's DTensor parameters saved by 2 ranks (rows, columns, replicated, an uneven dim) load on 4 ranks in
another sharding and on 1 rank into a plain module, and the loaded model's outputs equal the saved one's
(exactly); the metadata lists each tensor's chunks, replicated values are written once; atomicity: a save killed
(SIGKILL) before its ``.metadata`` leaves the previous checkpoint loadable (by torch's ``dcp.load`` too), and a
missing, corrupt or truncated data file is an error naming it, on every rank."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from pt_dist import checkpoint as dcp
from pt_dist.checkpoint import filesystem as fs
from pt_dist.device_mesh import init_device_mesh
from pt_dist.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import join, leave  # noqa: E402

X = torch.randn(5, 6, generator=torch.Generator().manual_seed(3))


def _plain(seed: int = 0) -> nn.Module:
    """An MLP whose first layer has 7 rows (uneven over 2 and 4 ranks)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 4))


PLACEMENTS = {  # per parameter, at save (2 ranks) and at load (4 ranks)
    "0.weight": (Shard(0), Shard(1)),
    "0.bias": (Shard(0), Replicate()),
    "2.weight": (Shard(1), Shard(0)),
    "2.bias": (Replicate(), Shard(0)),
}


def _sharded_state(model: nn.Module, mesh, which: int) -> dict:
    return {k: distribute_tensor(v.detach(), mesh, [PLACEMENTS[k][which]]) for k, v in model.state_dict().items()}


def _output(state: dict) -> torch.Tensor:
    full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}
    model = _plain()
    model.load_state_dict(full)
    with torch.no_grad():
        return model(X)


def _save_on_2(rank, world, root):
    if rank >= 2:  # (a pool of 4 processes; 2 of them make this job's world)
        return None
    join(rank, 2, "tcp", timeout=60, key="ck_save")
    try:
        mesh = init_device_mesh("cpu", (2,))
        state = {"model": _sharded_state(_plain(0), mesh, 0), "step": 5, "hparams": {"lr": [0.1, 0.2]},
                 "seen": torch.tensor([3.0, 4.0])}
        metadata = dcp.save(state, checkpoint_id=root)
        return _output(state["model"]), metadata
    finally:
        leave()


def _load_on_4(rank, world, root):
    join(rank, 4, "tcp", timeout=60, key="ck_load4")
    try:
        mesh = init_device_mesh("cpu", (4,))
        state = {"model": _sharded_state(_plain(1), mesh, 1), "step": 0, "hparams": {"lr": [0.0]},
                 "seen": torch.zeros(2)}
        dcp.load(state, checkpoint_id=root)
        local = {k: tuple(v.to_local().shape) for k, v in state["model"].items()}
        return _output(state["model"]), local, state["step"], state["hparams"], state["seen"]
    finally:
        leave()


def _load_on_1(rank, world, root):
    join(rank, 1, "tcp", timeout=60, key="ck_load1")
    try:
        plain = _plain(2)
        state = {"model": plain.state_dict(), "step": 0}
        dcp.load(state, checkpoint_id=root, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
        with torch.no_grad():
            return plain(X), state["step"]
    finally:
        leave()


def test_dtensor_state_saved_on_2_ranks_loads_on_4_ranks_and_into_a_plain_module_on_1(tmp_path):
    root = str(tmp_path / "ckpt")
    saved = run_ranks(_save_on_2, 4, root, backend=None, timeout=120)
    (out0, metadata), (out1, _) = saved[0], saved[1]
    assert torch.equal(out0, out1)
    md = metadata.state_dict_metadata
    assert [(tuple(c.offsets), tuple(c.sizes)) for c in md["model.0.weight"].chunks] == [((0, 0), (4, 6)),
                                                                                         ((4, 0), (3, 6))]
    assert [(tuple(c.offsets), tuple(c.sizes)) for c in md["model.2.weight"].chunks] == [((0, 0), (4, 4)),
                                                                                         ((0, 4), (4, 3))]
    assert tuple(md["model.2.bias"].size) == (4,) and len(md["model.2.bias"].chunks) == 1  # replicated: once
    assert type(md["step"]).__name__ == "BytesStorageMetadata" and metadata.planner_data["hparams.lr"] == (
        "hparams", "lr")
    writes = [k for k in metadata.storage_data if k != fs._FILES_KEY]
    assert sorted(k.fqn for k in writes if k.fqn == "seen") == ["seen"]  # a plain tensor both ranks hold
    files = sorted(os.listdir(root))
    assert files[0] == ".metadata" and len(files) == 3 and all(f.endswith(".distcp") for f in files[1:])

    loaded = run_ranks(_load_on_4, 4, root, backend=None, timeout=120)
    for rank, (out, _, step, hparams, seen) in enumerate(loaded):
        assert torch.equal(out, out0), rank  # the 4-rank model computes what the 2-rank one did
        assert (step, hparams, seen.tolist()) == (5, {"lr": [0.1, 0.2]}, [3.0, 4.0])
    assert [r[1]["0.weight"] for r in loaded] == [(7, 2), (7, 2), (7, 2), (7, 0)]  # Shard(1) of 6 columns
    assert [r[1]["2.weight"] for r in loaded] == [(1, 7)] * 4 and [r[1]["2.bias"] for r in loaded] == [(1,)] * 4

    [(plain_out, step)] = run_ranks(_load_on_1, 1, root, backend=None, timeout=60)
    assert torch.equal(plain_out, out0) and step == 5
    with torch.no_grad():
        assert not torch.allclose(_plain(2)(X), out0)  # (the fresh model differs: the load did the work)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _damaged(rank, world, root, damage):
    join(rank, 2, "tcp", timeout=60, key=f"ck_bad_{damage}")
    try:
        mesh = init_device_mesh("cpu", (2,))
        # loaded as columns what was saved as rows (and so on): every rank reads both ranks' files
        state = {"model": _sharded_state(_plain(1), mesh, 1), "step": 0, "hparams": {}, "seen": torch.zeros(2)}
        try:
            dcp.load(state, checkpoint_id=root)
        except dcp.CheckpointException as e:
            return str(e)
        return "loaded"
    finally:
        leave()


@pytest.mark.parametrize("damage", ["missing", "corrupt", "truncated", "no metadata"])
def test_a_missing_or_corrupt_shard_is_an_error_naming_the_file_on_every_rank(tmp_path, damage):
    root = tmp_path / "ckpt"
    run_ranks(_save_on_2, 4, str(root), backend=None, timeout=120)
    victim = sorted(p for p in root.iterdir() if p.name.startswith("__1_"))[0]
    {"missing": victim.unlink, "corrupt": lambda: _flip(victim), "truncated": lambda: _truncate(victim),
     "no metadata": (root / ".metadata").unlink}[damage]()
    errors = run_ranks(_damaged, 2, str(root), damage, backend=None, timeout=120)
    for e in errors:
        if damage == "no metadata":
            assert "no complete checkpoint" in e and ".metadata missing" in e
            continue
        assert str(victim) in e, e
        assert {"missing": "is missing", "corrupt": "CRC-32", "truncated": "bytes, the save wrote"}[damage] in e
    if damage != "no metadata":
        assert all("RANK 0" in e and "RANK 1" in e for e in errors)


def _kill_during_save(rank, world, root, where):
    """Save A, then in a forked child save B and SIGKILL the child at ``where``; report what loads after."""
    import torch.distributed.checkpoint as torch_dcp  # (here: the other ranks' processes need not import it)

    first = {"w": torch.arange(6.0), "tag": "A"}
    dcp.save(first, checkpoint_id=root, no_dist=True)
    pid = os.fork()
    if pid == 0:  # the child: save B and die before it commits
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)

        if where == "writing data":
            torch.save = die  # (the first tensor blob: its file is open, half the save is not on disk)
        else:
            os.replace = die  # every data file written and fsynced, .metadata.tmp too, not yet renamed
        dcp.save({"w": torch.arange(6.0) * 10, "tag": "B"}, checkpoint_id=root, no_dist=True)
        os._exit(0)  # (not reached)
    _, status = os.waitpid(pid, 0)
    left = sorted(os.listdir(root))
    ours = {"w": torch.zeros(6), "tag": None}
    dcp.load(ours, checkpoint_id=root, no_dist=True)
    theirs = {"w": torch.zeros(6), "tag": None}
    torch_dcp.load(theirs, checkpoint_id=root, no_dist=True)
    dcp.save({"w": torch.arange(6.0) * 100, "tag": "C"}, checkpoint_id=root, no_dist=True)  # a good one again
    after = sorted(os.listdir(root))
    third = {"w": torch.zeros(6), "tag": None}
    dcp.load(third, checkpoint_id=root, no_dist=True)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status), left, ours, theirs, after, third


@pytest.mark.parametrize("where", ["writing data", "before the metadata rename"])
def test_a_save_killed_before_its_metadata_leaves_the_previous_checkpoint(tmp_path, where):
    root = str(tmp_path / "ckpt")
    [(signo, left, ours, theirs, after, third)] = run_ranks(_kill_during_save, 1, root, where, backend=None,
                                                            timeout=60)
    assert signo == signal.SIGKILL
    assert len([f for f in left if f.endswith(".distcp")]) == 2  # A's file and the killed save's (or its start)
    for loaded in (ours, theirs):  # pt_dist and torch both read the previous save, A
        assert loaded["tag"] == "A" and torch.equal(loaded["w"], torch.arange(6.0))
    assert third["tag"] == "C" and torch.equal(third["w"], torch.arange(6.0) * 100)
    assert len(after) == 2 and after[0] == ".metadata"  # the commit swept A's and the killed save's files


def test_nested_state_dict_round_trip_and_the_file_layout_in_one_process(tmp_path):
    """torch's test_file_system_checkpoint cases: nested dicts and lists, tensors of several dtypes, a 0-d tensor,
    objects; a wrong size is refused naming the key; overwrite=False refuses an existing checkpoint; a module as a
    Stateful value; several writer threads."""
    state = {"a": {"b": torch.randn(3, 2), "c": [torch.arange(4), {"d": torch.tensor(1.5, dtype=torch.float64)}]},
             "e": [1, 2, 3], "f": "text", "g": (4, "five"), "h": torch.ones(2, dtype=torch.bfloat16)}
    metadata = dcp.save(state, checkpoint_id=tmp_path, no_dist=True)
    assert sorted(metadata.state_dict_metadata) == ["a.b", "a.c.0", "a.c.1.d", "e", "f", "g", "h"]
    target = {"a": {"b": torch.zeros(3, 2), "c": [torch.zeros(4, dtype=torch.long), {"d": torch.tensor(0.0,
              dtype=torch.float64)}]}, "e": None, "f": None, "g": None, "h": torch.zeros(2, dtype=torch.bfloat16)}
    keep = target["a"]["b"]
    dcp.load(target, checkpoint_id=tmp_path, no_dist=True)
    assert target["a"]["b"] is keep and torch.equal(keep, state["a"]["b"])  # in place
    assert torch.equal(target["a"]["c"][0], state["a"]["c"][0]) and target["a"]["c"][1]["d"].item() == 1.5
    assert (target["e"], target["f"], target["g"]) == ([1, 2, 3], "text", (4, "five"))
    assert torch.equal(target["h"], state["h"])
    with pytest.raises(dcp.CheckpointException, match=r"Size mismatch .* for a\.b"):
        dcp.load({"a": {"b": torch.zeros(2, 2)}}, checkpoint_id=tmp_path, no_dist=True,
                 planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    with pytest.raises(dcp.CheckpointException, match="Missing key in checkpoint state_dict: nope"):
        dcp.load({"nope": torch.zeros(1)}, checkpoint_id=tmp_path, no_dist=True)
    with pytest.raises(dcp.CheckpointException, match="Checkpoint already exists"):
        dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path, overwrite=False), no_dist=True)
    with pytest.raises(TypeError):
        dcp.save(state, tmp_path)  # checkpoint_id is keyword-only, as torch's
    with pytest.raises(ValueError, match="use_collectives=False"):
        dcp.save(state, checkpoint_id=tmp_path, use_collectives=False)
    saved, loaded = _plain(0), _plain(1)  # Stateful values: save calls state_dict(), load load_state_dict()
    dcp.save({"model": saved}, checkpoint_id=tmp_path / "stateful", no_dist=True)
    dcp.load({"model": loaded}, checkpoint_id=tmp_path / "stateful", no_dist=True)
    assert all(torch.equal(a, b) for a, b in zip(saved.parameters(), loaded.parameters()))
    many = dcp.FileSystemWriter(tmp_path / "threads", thread_count=2, single_file_per_rank=True)
    dcp.save(state, storage_writer=many, no_dist=True)
    assert len([f for f in os.listdir(tmp_path / "threads") if f.endswith(".distcp")]) == 2
    again = {"a": {"b": torch.zeros(3, 2)}}
    dcp.load(again, checkpoint_id=tmp_path / "threads", no_dist=True,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(again["a"]["b"], state["a"]["b"])


# --- format_utils: DCP <-> torch.save, and DCP checkpoints interchangeable with torch's both ways ----------------

def _nested_state():
    return {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3, dtype=torch.bfloat16)},
            "step": 7, "optim": {"state": {"w": {"exp_avg": torch.full((3, 4), 0.5)}}, "lr": [0.1, 0.01]}}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def test_format_utils_convert_both_ways_and_interchange_with_torch(tmp_path):
    """torch's test/distributed/checkpoint/test_format_utils.py (test_dcp_to_torch, test_torch_to_dcp), run on
    both libraries' checkpoints: a DCP checkpoint either writes converts with either's dcp_to_torch_save, and
    either's torch_save_to_dcp output loads in both."""
    import torch.distributed.checkpoint as torch_dcp
    import torch.distributed.checkpoint.format_utils as theirs
    from pt_dist._compat.checkpoint.format_utils import _EmptyStateDictLoadPlanner
    from pt_dist.checkpoint import format_utils as ours

    state = _nested_state()
    dcp.save(state, checkpoint_id=tmp_path / "ours_dcp", no_dist=True)
    torch_dcp.save(state, checkpoint_id=tmp_path / "torch_dcp", no_dist=True)
    for writer in ("ours_dcp", "torch_dcp"):
        for name, lib in (("ours", ours), ("theirs", theirs)):
            lib.dcp_to_torch_save(tmp_path / writer, tmp_path / f"{writer}_by_{name}.pt")
            assert _same(torch.load(tmp_path / f"{writer}_by_{name}.pt", weights_only=False), state), (writer, name)
    torch.save(state, tmp_path / "plain.pt")
    ours.torch_save_to_dcp(tmp_path / "plain.pt", tmp_path / "from_plain")
    for load in (dcp.load, torch_dcp.load):
        target = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(3, dtype=torch.bfloat16)}, "step": 0,
                  "optim": {"state": {"w": {"exp_avg": torch.zeros(3, 4)}}, "lr": None}}
        load(target, checkpoint_id=tmp_path / "from_plain", no_dist=True)
        assert _same(target, state), load
    with pytest.raises(ValueError, match="empty state dict"):
        _EmptyStateDictLoadPlanner().set_up_planner({"x": 1}, None)


def _broadcast_torch_save(rank, world, path):
    from pt_dist.checkpoint.format_utils import BroadcastingTorchSaveReader, DynamicMetaLoadPlanner
    from pt_dist.device_mesh import init_device_mesh
    from pt_dist.tensor import Shard, distribute_tensor

    join(rank, world, "tcp")
    try:
        mesh = init_device_mesh("cpu", (world,))
        state = {"w": distribute_tensor(torch.zeros(4, 3), mesh, [Shard(0)]), "b": torch.zeros(3)}
        dcp.load(state, checkpoint_id=path, storage_reader=BroadcastingTorchSaveReader(),
                 planner=DynamicMetaLoadPlanner())
        return state["w"].to_local(), state["b"]
    finally:
        leave()


def test_broadcasting_torch_save_reader_loads_a_torch_save_file_into_shards(tmp_path):
    torch.save({"w": torch.arange(12.0).reshape(4, 3), "b": torch.tensor([1.0, 2.0, 3.0])}, tmp_path / "m.pt")
    for rank, (w, b) in enumerate(run_ranks(_broadcast_torch_save, 2, str(tmp_path / "m.pt"), backend=None,
                                            timeout=60)):
        assert torch.equal(w, torch.arange(12.0).reshape(4, 3)[2 * rank:2 * rank + 2])
        assert torch.equal(b, torch.tensor([1.0, 2.0, 3.0]))
