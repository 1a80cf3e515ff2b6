"""torch's own tutorial scripts (``examples/``) on pt-dist, side by side with the same files on torch.distributed.

Each torch-side file is rebuilt from the drop-in by swapping its import lines back; swapping the header's other
(CUDA-only) lines back too must give upstream's sha256, so the diff is exactly what the header says. Four runs of
each script, in the same ranks, one after another: torch's file on gloo (the reference), torch's file on
``pt_shm`` (only the backend string changed: torch's own DDP / FSDP on pt-dist's shared-memory collectives), the
drop-in as it is (pt-dist's DDP / FSDP on its gloo adapter) and the drop-in on pt-dist's own ``shm``. Every
printed line, loss and saved tensor must equal the reference's.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from examples_testutil import EXAMPLES, JOB_PRELUDE, MARK, _check, _env, _swap, _upstream_sha  # noqa: E402

# ---------------------------------------------------------------- pytorch/examples ddp-tutorial-series
DDP_DIR = EXAMPLES / "ddp-tutorial-series"
DDP_UPSTREAM_SHA256 = "6b0a1568337fe206fa74e971cfeec42317f40b82122475327d50f0a0d37e1ba7"
DATAUTILS_SHA256 = "6af257501c49d1373b9b57f47e54ec9260eef7d97ad46b59cd0280cbbd6cc779"
DDP_IMPORTS = [
    ("from pt_dist.nn.parallel import DistributedDataParallel as DDP\n",
     "from torch.nn.parallel import DistributedDataParallel as DDP\n", 1),
    ("from pt_dist import init_process_group, destroy_process_group\n",
     "from torch.distributed import init_process_group, destroy_process_group\n", 1),
]
DDP_CUDA = [
    ('    # torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n',
     '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n', 1),
    ('    init_process_group(backend="gloo")\n', '    init_process_group(backend="nccl")\n', 1),
    ('        self.model = model.to("cpu")\n', "        self.model = model.to(self.gpu_id)\n", 1),
    ("        self.model = DDP(self.model)\n", "        self.model = DDP(self.model, device_ids=[self.gpu_id])\n", 1),
    ('        loc = "cpu"\n', '        loc = f"cuda:{self.gpu_id}"\n', 1),
    ('            source = source.to("cpu")\n', "            source = source.to(self.gpu_id)\n", 1),
    ('            targets = targets.to("cpu")\n', "            targets = targets.to(self.gpu_id)\n", 1),
]
DDP_BACKEND = '    init_process_group(backend="gloo")\n'

# Runs in each torchrun rank: every (variant, mode) of the plan one after another, each from the same per-rank
# seed (rank 1's initial weights and data differ from rank 0's, so DDP's broadcast matters), in its own folder
# (the snapshot is ./snapshot.pt). F.cross_entropy is wrapped to record each loss; in "mse" mode it is mse_loss.
DDP_JOB = JOB_PRELUDE + """
import contextlib, io, json, os, runpy, sys
import torch, torch.nn.functional as F
import pt_dist  # registers pt_shm with torch

rank, out_dir, plan = int(os.environ["RANK"]), sys.argv[1], json.loads(open(sys.argv[2]).read())
sys.path.insert(0, os.path.dirname(plan[0]["script"]))  # datautils
real_ce, results = F.cross_entropy, {}
for run in plan:
    losses, buf = [], io.StringIO()
    print(f"rank {rank}: {run['name']}", file=sys.stderr, flush=True)
    def ce(input, target, *a, _mse=run["mode"] == "mse", **k):
        loss = F.mse_loss(input, target) if _mse else real_ce(input, target, *a, **k)
        losses.append(loss.item())
        return loss
    fresh_master_port(rank, run["name"])
    os.makedirs(run["cwd"], exist_ok=True)
    os.chdir(run["cwd"])
    torch.manual_seed(1000 + rank)
    F.cross_entropy, saved = ce, sys.argv
    sys.argv = [run["script"], *run["argv"]]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(run["script"], run_name="__main__")
    finally:
        F.cross_entropy, sys.argv = real_ce, saved
    results[run["name"]] = {"stdout": buf.getvalue(), "losses": losses}
json.dump(results, open(os.path.join(out_dir, f"rank{rank}.json"), "w"))
"""


def test_ddp_tutorial_multigpu_torchrun_is_upstream_but_for_the_listed_lines():
    text = (DDP_DIR / "multigpu_torchrun.py").read_text()
    assert "pt_dist" not in _swap(text, DDP_IMPORTS, "multigpu_torchrun.py").split(MARK, 1)[1]
    assert _upstream_sha(_swap(_swap(text, DDP_IMPORTS, "imports"), DDP_CUDA, "cuda")) == DDP_UPSTREAM_SHA256
    assert hashlib.sha256((DDP_DIR / "datautils.py").read_bytes()).hexdigest() == DATAUTILS_SHA256


def test_ddp_tutorial_multigpu_torchrun_trains_as_under_torch(tmp_path):
    """2 epochs (a snapshot after each), then a resumed run to 3 from the snapshot, then 2 epochs with mse_loss."""
    ours_text = (DDP_DIR / "multigpu_torchrun.py").read_text()
    theirs_text = _swap(ours_text, DDP_IMPORTS, "multigpu_torchrun.py")
    shm = [(DDP_BACKEND, DDP_BACKEND.replace("gloo", "shm"), 1)]
    pt_shm = [(DDP_BACKEND, DDP_BACKEND.replace("gloo", "pt_shm"), 1)]
    files = {"torch/gloo": theirs_text, "torch/pt_shm": _swap(theirs_text, pt_shm, "torch"),
             "pt_dist/gloo": ours_text, "pt_dist/shm": _swap(ours_text, shm, "ours")}
    plan = []
    for i, (name, text) in enumerate(files.items()):
        script = DDP_DIR / "multigpu_torchrun.py" if name == "pt_dist/gloo" else tmp_path / f"variant{i}.py"
        if script.parent == tmp_path:
            script.write_text(text)
        for mode, argv in (("plain", ["2", "1"]), ("resume", ["3", "1"]), ("mse", ["2", "1"])):
            cwd = tmp_path / f"run{i}" / ("mse" if mode == "mse" else "plain")
            plan.append({"name": f"{name} {mode}", "script": str(script), "cwd": str(cwd), "mode": mode,
                         "argv": [*argv, "--batch_size", "64"]})
    (tmp_path / "datautils.py").write_bytes((DDP_DIR / "datautils.py").read_bytes())
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "job.py").write_text(DDP_JOB)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(tmp_path / "job.py"), str(tmp_path), str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=300, env=_env())
    _check(proc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, got in enumerate(ranks):
        ref = {mode: got[f"torch/gloo {mode}"] for mode in ("plain", "resume", "mse")}
        # the script's own lines: 1024 samples per rank, 16 steps of 64, the snapshot saved and resumed from
        assert ref["plain"]["stdout"].count(f"[GPU{r}] Epoch ") == 2 and "Steps: 16" in ref["plain"]["stdout"]
        assert "Resuming training from snapshot at Epoch 1" in ref["resume"]["stdout"]
        assert set(ref["plain"]["losses"]) == {0.0}  # upstream's loss: cross_entropy over one logit
        assert len(ref["mse"]["losses"]) == 32 and min(ref["mse"]["losses"]) > 0
        for name in files:
            for mode in ("plain", "resume", "mse"):
                assert got[f"{name} {mode}"] == ref[mode], (name, mode, r)
    assert ranks[0]["torch/gloo mse"]["losses"] != ranks[1]["torch/gloo mse"]["losses"]  # rank-own data
    snapshots = [torch.load(tmp_path / f"run{i}" / sub / "snapshot.pt") for i in range(4) for sub in ("plain", "mse")]
    for i, snap in enumerate(snapshots):
        ref = snapshots[i % 2]
        assert snap["EPOCHS_RUN"] == ref["EPOCHS_RUN"] and snap["MODEL_STATE"].keys() == ref["MODEL_STATE"].keys()
        for k, v in snap["MODEL_STATE"].items():
            assert torch.equal(v, ref["MODEL_STATE"][k]), (i, k)
    # the check can fail: with mse_loss the all-reduced SGD moved the weights (the plain run's never move)
    assert not torch.equal(snapshots[0]["MODEL_STATE"]["weight"], snapshots[1]["MODEL_STATE"]["weight"])


# ---------------------------------------------------------------- pytorch/tutorials FSDP_tutorial.rst (FSDP1)
FSDP_FILE = EXAMPLES / "fsdp_mnist.py"
FSDP_UPSTREAM_SHA256 = "a5f5210c9664cad6b08a6e4dd0e9f5cac6e21bf0819c0e85c170375218906f11"
FSDP_IMPORTS = [
    ("import pt_dist as dist\n", "import torch.distributed as dist\n", 1),
    ("from pt_dist.nn.parallel import DistributedDataParallel as DDP\n",
     "from torch.nn.parallel import DistributedDataParallel as DDP\n", 1),
    ("from pt_dist.fsdp import FullyShardedDataParallel as FSDP\n",
     "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n", 1),
    ("from pt_dist.fsdp.fully_sharded_data_parallel import (\n",
     "from torch.distributed.fsdp.fully_sharded_data_parallel import (\n", 1),
    ("from pt_dist.fsdp.wrap import (\n", "from torch.distributed.fsdp.wrap import (\n", 1),
]
FSDP_OTHER = [  # (here, upstream, count): the header's CUDA-only and data lines
    ('    dist.init_process_group("gloo", rank=rank, world_size=world_size)\n',
     '    dist.init_process_group("nccl", rank=rank, world_size=world_size)\n', 1),
    ("    dataset1 = datasets.FakeData(size=128, image_size=(1, 28, 28), num_classes=10,\n",
     "    dataset1 = datasets.MNIST('../data', train=True, download=True,\n", 1),
    ("    dataset2 = datasets.FakeData(size=64, image_size=(1, 28, 28), num_classes=10, random_offset=128,\n",
     "    dataset2 = datasets.MNIST('../data', train=False,\n", 1),
    ("    # train_kwargs.update(cuda_kwargs)\n", "    train_kwargs.update(cuda_kwargs)\n", 1),
    ("    # test_kwargs.update(cuda_kwargs)\n", "    test_kwargs.update(cuda_kwargs)\n", 1),
    ("    # torch.cuda.set_device(rank)\n", "    torch.cuda.set_device(rank)\n", 1),
    ("    # init_start_event.record()\n", "    init_start_event.record()\n", 1),
    ("    # init_end_event.record()\n", "    init_end_event.record()\n", 1),
    ('        # print(f"CUDA event elapsed time:', '        print(f"CUDA event elapsed time:', 1),
    ('    model = Net().to("cpu")\n', "    model = Net().to(rank)\n", 1),
    ('    model = FSDP(model, device_id=torch.device("cpu"))\n', "    model = FSDP(model)\n", 1),
    ('torch.zeros(2).to("cpu")\n', "torch.zeros(2).to(rank)\n", 1),
    ('torch.zeros(3).to("cpu")\n', "torch.zeros(3).to(rank)\n", 1),
    ('data, target = data.to("cpu"), target.to("cpu")\n', "data, target = data.to(rank), target.to(rank)\n", 2),
    ("    WORLD_SIZE = 2\n", "    WORLD_SIZE = torch.cuda.device_count()\n", 1),
]
FSDP_BACKEND = '    dist.init_process_group("gloo", rank=rank, world_size=world_size)\n'
FSDP_ARGV = ["--epochs", "2", "--batch-size", "32", "--test-batch-size", "32", "--save-model"]

# The four variants in one mp.spawn, one after another, as the page's fsdp_main(rank, world_size, args) (its
# __main__ block is argparse and mp.spawn of that function). Each variant starts from torch's default seed, as the
# page's spawned ranks do (its torch.manual_seed runs in the parent only).
FSDP_JOB = """
import argparse, contextlib, gc, io, json, os, runpy, sys
import torch
import torch.multiprocessing as mp


def _rank(rank, plan, out_dir, barrier):
    import pt_dist  # registers pt_shm with torch
    results = {}
    for run in plan:
        barrier.wait()  # the page re-inits on its fixed port: no rank may reach the last run's store
        os.makedirs(run["cwd"], exist_ok=True)
        os.chdir(run["cwd"])
        g = runpy.run_path(run["script"], run_name="fsdp_example")
        args = argparse.Namespace(batch_size=32, test_batch_size=32, epochs=2, lr=1.0, gamma=0.7, no_cuda=False,
                                  seed=1, save_model=True)
        torch.manual_seed(67280421310721)  # torch's default seed: what a fresh spawned rank starts from
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            g["fsdp_main"](rank, 2, args)
        results[run["name"]] = buf.getvalue()
        del g
        # torch's FSDP1 leaves its units in a cycle that holds torch's TCPStore (and its port) after
        # destroy_process_group; torch's own re-init shares it (env:// stores are multi-tenant), pt-dist's cannot
        gc.collect()
    json.dump(results, open(os.path.join(out_dir, f"rank{rank}.json"), "w"))


if __name__ == "__main__":
    barrier = mp.get_context("spawn").Barrier(2)
    mp.spawn(_rank, args=(json.loads(open(sys.argv[2]).read()), sys.argv[1], barrier), nprocs=2, join=True)
"""


def test_fsdp_tutorial_is_the_pages_code_but_for_the_listed_lines():
    text = _swap(FSDP_FILE.read_text(), FSDP_IMPORTS, "fsdp_mnist.py")
    assert "pt_dist" not in text.split(MARK, 1)[1]
    assert _upstream_sha(_swap(text, FSDP_OTHER, "fsdp_mnist.py")) == FSDP_UPSTREAM_SHA256


def _fsdp_lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if ln.startswith(("Train Epoch", "Test set"))]


def test_fsdp_tutorial_trains_as_under_torch(tmp_path):
    pytest.importorskip("torchvision")
    ours_text = FSDP_FILE.read_text()
    theirs_text = _swap(ours_text, FSDP_IMPORTS, "fsdp_mnist.py")
    variants = {"torch/gloo": theirs_text,
                "torch/pt_shm": _swap(theirs_text, [(FSDP_BACKEND, FSDP_BACKEND.replace("gloo", "pt_shm"), 1)], "t"),
                "pt_dist/gloo": ours_text,
                "pt_dist/shm": _swap(ours_text, [(FSDP_BACKEND, FSDP_BACKEND.replace("gloo", "shm"), 1)], "o")}
    plan = []
    for i, (name, text) in enumerate(variants.items()):
        (tmp_path / f"variant{i}.py").write_text(text)
        plan.append({"name": name, "script": str(tmp_path / f"variant{i}.py"), "cwd": str(tmp_path / f"run{i}")})
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "job.py").write_text(FSDP_JOB)
    proc = subprocess.run([sys.executable, str(tmp_path / "job.py"), str(tmp_path), str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=300, env=_env())
    _check(proc)
    out = json.loads((tmp_path / "rank0.json").read_text())
    ref = _fsdp_lines(out["torch/gloo"])
    assert len(ref) == 4 and ref[0].startswith("Train Epoch: 1") and ref[2].startswith("Train Epoch: 2")
    for name in variants:
        assert _fsdp_lines(out[name]) == ref, name
    # the printed model: FSDP1's one unit around Net (the page's FlattenParamsWrapper is torch 1.11's)
    assert "FullyShardedDataParallel(\n  (_fsdp_wrapped_module): Net(" in out["pt_dist/gloo"]
    saved = [torch.load(tmp_path / f"run{i}" / "mnist_cnn.pt") for i in range(4)]
    own = saved[2]
    # the plain module's names (conv1.weight, ...) and shapes, as torch's
    assert {k: v.shape for k, v in own.items()} == {k: v.shape for k, v in saved[0].items()}
    for sd in saved:
        assert sd.keys() == saved[0].keys()
        for k in sd:
            assert torch.equal(sd[k], saved[0][k]), k
    # the check can fail: the saved weights moved away from Net()'s initialisation
    torch.manual_seed(67280421310721)
    g = __import__("runpy").run_path(str(tmp_path / "variant0.py"), run_name="fsdp_example")
    assert not torch.equal(g["Net"]().state_dict()["fc2.weight"], saved[0]["fc2.weight"])
