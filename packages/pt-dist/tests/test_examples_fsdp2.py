"""pytorch/examples' ``distributed/FSDP2/`` (example.py + checkpoint.py, model.py, utils.py) as pt-dist drop-ins
(issue 33, section 3): the diff against upstream is the header's lines.

The torch-side files are rebuilt from the drop-ins by swapping their import and process-group lines back; swapping
the CPU line back too gives upstream's sha256 (model.py is upstream's byte for byte). Then one torchrun runs the
script on torch and on pt-dist, in the same 2 ranks, twice each (a fresh run, then the run that resumes from its
checkpoint) through both of its checkpoint paths: every loss, printed line and saved tensor must be equal.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import subprocess
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from examples_testutil import EXAMPLES, JOB_PRELUDE, MARK, _check, _env, _swap, _upstream_sha  # noqa: E402

FSDP2_DIR = EXAMPLES / "FSDP2"
UPSTREAM_SHA256 = {"example.py": "f84fb0503517ee5c6a6100c69bd0ccc55431e141643a32de88fadfb3407ecc6c",
                   "checkpoint.py": "1853b455639d6b761a695ca2140f104602b1a61d1a96afce2ae3959b20058ad6",
                   "utils.py": "d6b548bdf0285d2a20d8a149ebbe57fa09f178b469b70880db69e4ffab14c93d"}
MODEL_SHA256 = "0217ad585158062fc6f61ada9dbe1493bf70d4fd9be94b48aad82d255634186d"
TORCH_SIDE = {  # file -> (ours, torch's, count): what turns the drop-in back into torch's
    "example.py": [
        ("import pt_dist\nfrom pt_dist.fsdp import fully_shard, MixedPrecisionPolicy\n",
         "from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy\n", 1),
        ("    backend = pt_dist.get_default_backend_for_device(device)\n",
         "    backend = torch.distributed.get_default_backend_for_device(device)\n", 1),
        ("    pt_dist.init_process_group(backend=backend, device_id=device)\n",
         "    torch.distributed.init_process_group(backend=backend, device_id=device)\n", 1),
        ("    pt_dist.destroy_process_group()\n", "    torch.distributed.destroy_process_group()\n", 1)],
    "checkpoint.py": [
        ("from pt_dist.checkpoint.state_dict import (\n", "from torch.distributed.checkpoint.state_dict import (\n", 1),
        ("from pt_dist.fsdp import FSDPModule\n", "from torch.distributed.fsdp import FSDPModule\n", 1),
        ("from pt_dist.tensor import distribute_tensor, DTensor\n",
         "from torch.distributed.tensor import distribute_tensor, DTensor\n", 1)],
    "utils.py": [
        ("from pt_dist.fsdp import FSDPModule\n", "from torch.distributed.fsdp import FSDPModule\n", 1),
        ("from pt_dist.tensor import Shard\n", "from torch.distributed.tensor import Shard\n", 1)],
}
CPU_LINE = [("    if torch.accelerator.is_available() and not verify_min_gpu_count(min_gpus=_min_gpu_count):\n",
             "    if not verify_min_gpu_count(min_gpus=_min_gpu_count):\n", 1)]

def test_fsdp2_example_is_upstream_but_for_the_listed_lines():
    for name, pairs in TORCH_SIDE.items():
        text = (FSDP2_DIR / name).read_text()
        theirs = _swap(text, pairs, name)
        assert "pt_dist" not in theirs.split(MARK, 1)[1], name
        if name == "example.py":
            theirs = _swap(theirs, CPU_LINE, "cpu")
        assert _upstream_sha(theirs) == UPSTREAM_SHA256[name], name
    assert hashlib.sha256((FSDP2_DIR / "model.py").read_bytes()).hexdigest() == MODEL_SHA256
# torch 2.15's gloo refuses device_id=torch.device("cpu") (no index): the torch-side run alone gets cpu:0.
TORCH_CPU = [('        device = torch.device("cpu")\n', '        device = torch.device("cpu", 0)\n', 1)]

# Runs in each torchrun rank: the plan's runs one after another, each as `python example.py ...` in its own
# folder (./checkpoints is the script's), with the library's four files first on sys.path. Test-side, not in the
# files: Tensor.backward records each loss; Checkpointer.load_model records how far the loaded model is from the
# file it read; Transformer.reset_parameters also resets the blocks (upstream's resets only the embeddings, norm
# and output, so the blocks keep to_empty's uninitialised memory: on CPU torch's own run then ends in NaN);
# ModelArgs builds 4 blocks, not the script's 10 (each block is an FSDP unit: its all-gathers and reduce-scatters,
# not its arithmetic, were the test's time; 4 keep both prefetch settings' windows of 2 inside the stack).
FSDP2_JOB = JOB_PRELUDE + """
import contextlib, io, json, os, runpy, sys
import torch

rank, out_dir, plan = int(os.environ["RANK"]), sys.argv[1], json.loads(open(sys.argv[2]).read())
real_backward, results = torch.Tensor.backward, {}
for run in plan:
    print(f"rank {rank}: {run['name']}", file=sys.stderr, flush=True)
    fresh_master_port(rank, run["name"])
    os.makedirs(run["cwd"], exist_ok=True)
    os.chdir(run["cwd"])
    for name in ("checkpoint", "model", "utils"):
        sys.modules.pop(name, None)
    sys.path.insert(0, run["dir"])
    import checkpoint, model
    losses, loaded = [], []

    def backward(self, *a, **k):
        losses.append(self.item())
        return real_backward(self, *a, **k)

    def reset_parameters(self, _real=model.Transformer.reset_parameters):
        _real(self)
        for layer in self.layers:
            layer.reset_parameters()

    def load_model(self, m, _real=checkpoint.Checkpointer.load_model):
        _real(self, m)
        path = f"{self.folder}/{'dcp_api' if self.dcp_api else 'dtensor_api'}/{self.last_training_time}"
        saved = torch.load(f"{path}/model_state_dict.pt", weights_only=True)
        got = {k: v.full_tensor() for k, v in m.state_dict().items()}
        loaded.append(sorted(got) == sorted(saved) and max((got[k] - saved[k]).abs().max().item() for k in got))

    def model_args(_real=model.ModelArgs, **kwargs):
        return _real(**{**kwargs, "n_layers": 4})

    model.Transformer.reset_parameters, checkpoint.Checkpointer.load_model = reset_parameters, load_model
    model.ModelArgs = model_args
    torch.Tensor.backward, saved_argv, buf = backward, sys.argv, io.StringIO()
    sys.argv = [os.path.join(run["dir"], "example.py"), *run["argv"]]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        torch.Tensor.backward, sys.argv = real_backward, saved_argv
        sys.path.remove(run["dir"])
    results[run["name"]] = {"stdout": buf.getvalue(), "losses": losses, "loaded": loaded}
json.dump(results, open(os.path.join(out_dir, f"rank{rank}.json"), "w"))
"""
VARIANTS = {"dtensor_api": ["--explicit-prefetching"], "dcp_api": ["--dcp-api", "--mixed-precision"]}


def _saved(folder: pathlib.Path) -> list[dict]:
    """The (model, optimizer) state dicts each run saved, oldest first."""
    runs = sorted(folder.iterdir(), key=lambda p: int(p.name))
    return [{f: torch.load(p / f, weights_only=True) for f in ("model_state_dict.pt", "optim_state_dict.pt")}
            for p in runs]


def _equal(a, b, where: str):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_fsdp2_example_trains_and_resumes_as_under_torch(tmp_path):
    theirs = tmp_path / "torch_files"
    theirs.mkdir()
    for name in ("example.py", "checkpoint.py", "utils.py"):
        text = _swap((FSDP2_DIR / name).read_text(), TORCH_SIDE[name], name)
        (theirs / name).write_text(_swap(text, TORCH_CPU, "torch cpu") if name == "example.py" else text)
    (theirs / "model.py").write_bytes((FSDP2_DIR / "model.py").read_bytes())
    plan = [{"name": f"{lib} {api} {mode}", "dir": str(theirs if lib == "torch" else FSDP2_DIR),
             "cwd": str(tmp_path / lib), "argv": argv}
            for api, argv in VARIANTS.items() for lib in ("torch", "pt_dist") for mode in ("fresh", "resume")]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "job.py").write_text(FSDP2_JOB)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(tmp_path / "job.py"), str(tmp_path), str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=300, env=_env())
    _check(proc)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for got in ranks:
        for api in VARIANTS:
            for mode in ("fresh", "resume"):
                ref, ours = got[f"torch {api} {mode}"], got[f"pt_dist {api} {mode}"]
                ref = {**ref, "stdout": ref["stdout"].replace("on device cpu:0\n", "on device cpu\n")}  # TORCH_CPU
                assert len(ref["losses"]) == 10 and all(math.isfinite(v) for v in ref["losses"]), (api, mode)
                assert ours == ref, (api, mode)
                # the resumed run's model is the file's, exactly; the fresh run loads nothing
                assert ref["loaded"] == ([0.0] if mode == "resume" else []), (api, mode)
            # the check can fail: the losses move over the steps, and the resumed run goes on from lower
            fresh, resume = got[f"torch {api} fresh"]["losses"], got[f"torch {api} resume"]["losses"]
            assert len(set(fresh)) == 10 and resume[0] < fresh[0], api
    printed = ranks[0]["pt_dist dtensor_api fresh"]["stdout"]
    assert "Running on device cpu" in printed and "(layers): ModuleList(" in printed
    for api in VARIANTS:
        ref, ours = _saved(tmp_path / "torch" / "checkpoints" / api), _saved(tmp_path / "pt_dist" / "checkpoints" / api)
        assert len(ref) == len(ours) == 2
        for i, (a, b) in enumerate(zip(ref, ours)):
            _equal(b, a, f"{api} run {i}")
        assert not torch.equal(ref[0]["model_state_dict.pt"]["output.weight"],
                               ref[1]["model_state_dict.pt"]["output.weight"])
