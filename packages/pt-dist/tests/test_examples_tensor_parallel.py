"""pytorch/examples' ``distributed/tensor_parallelism/`` (``tensor_parallel_example.py``,
``sequence_parallel_example.py``, with upstream's ``log_utils.py``) as pt-dist drop-ins (issue 48): the diff
against upstream is the header's lines.

The torch-side files are rebuilt from the drop-ins by swapping their import lines back; swapping the CPU lines
back too gives upstream's sha256. The scripts print no loss, so the copies the test runs (both sides) also print
each iteration's output sum and the trained parameters. One torchrun runs each script on torch and on pt-dist in
the same 2 ranks, from the same seed: every printed line must be equal.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from examples_testutil import EXAMPLES, JOB_PRELUDE, MARK, _check, _env, _swap, _upstream_sha  # noqa: E402

TP_DIR = EXAMPLES / "tensor_parallelism"
UPSTREAM_SHA256 = {"tensor_parallel_example.py": "bec82850ab873b31a79814fb71ce74852d28e1d5a3a9d21bffcdd7e6d4d4bce0",
                   "sequence_parallel_example.py":
                       "dc8a1d6aecac3b7cae9c734013f5ff36252fabc2bb7a9cb6925b35013e07d3c2"}
LOG_UTILS_SHA256 = "57ab033bd4c0d67fd55e8ffc23164ccafe87034aea82f4ca8f1a994ef01adb04"
IMPORTS = [("import pt_dist as dist\n", "import torch.distributed as dist\n", 1),
           ("from pt_dist.tensor.parallel import (\n", "from torch.distributed.tensor.parallel import (\n", 1),
           ("from pt_dist._tensor.device_mesh import init_device_mesh\n",
            "from torch.distributed._tensor.device_mesh import init_device_mesh\n", 1)]
SP_IMPORT = [("from pt_dist._tensor import Shard\n", "from torch.distributed._tensor import Shard\n", 1)]
CPU = [("if torch.accelerator.is_available() and not verify_min_gpu_count(min_gpus=_min_gpu_count):\n",
        "if not verify_min_gpu_count(min_gpus=_min_gpu_count):\n", 1),
       ('device_type = "cpu"\n', "device_type = torch.accelerator.current_accelerator().type\n", 1)]
MODEL = {"tensor_parallel_example.py": ("tp_model", "Tensor Parallel"),
         "sequence_parallel_example.py": ("sp_model", "Sequence Parallel")}


def _imports(name: str):
    return IMPORTS + (SP_IMPORT if name.startswith("sequence") else [])


def _printing(text: str, name: str) -> str:
    """The test's copy: each iteration's output sum, then every trained parameter in full, printed."""
    model, what = MODEL[name]
    return _swap(text, [
        ("    output.sum().backward()\n",
         '    output.sum().backward()\n    print(f"iter {i} output sum {output.sum().item()!r}")\n', 1),
        (f'rank_log(_rank, logger, "{what} training completed!")\n',
         f'rank_log(_rank, logger, "{what} training completed!")\n'
         f'for n, p in {model}.named_parameters():\n    print(n, p.placements, p.full_tensor().tolist())\n', 1)],
        name)


JOB = JOB_PRELUDE + """
import contextlib, io, json, os, runpy, sys
import torch

rank, out_dir, plan = int(os.environ["RANK"]), sys.argv[1], json.loads(open(sys.argv[2]).read())
sys.path.insert(0, os.path.dirname(plan[0]["script"]))  # log_utils
results = {}
for run in plan:
    buf = io.StringIO()
    fresh_master_port(rank, run["name"])
    torch.manual_seed(0)
    with contextlib.redirect_stdout(buf):
        runpy.run_path(run["script"], run_name="__main__")
    results[run["name"]] = buf.getvalue()
json.dump(results, open(os.path.join(out_dir, f"rank{rank}.json"), "w"))
"""


@pytest.mark.parametrize("name", sorted(MODEL))
def test_tensor_parallelism_example_is_upstream_but_for_the_listed_lines(name):
    text = (TP_DIR / name).read_text()
    theirs = _swap(text, _imports(name), name)
    assert "pt_dist" not in theirs.split(MARK, 1)[1]
    assert _upstream_sha(_swap(theirs, CPU, "cpu")) == UPSTREAM_SHA256[name]
    assert hashlib.sha256((TP_DIR / "log_utils.py").read_bytes()).hexdigest() == LOG_UTILS_SHA256


def test_tensor_parallelism_examples_train_as_under_torch(tmp_path):
    plan = []
    for name in sorted(MODEL):
        ours = _printing((TP_DIR / name).read_text(), name)
        for side, text in (("torch", _swap(ours, _imports(name), name)), ("pt_dist", ours)):
            script = tmp_path / f"{side}_{name}"
            script.write_text(text)
            plan.append({"name": f"{side} {name}", "script": str(script)})
    (tmp_path / "log_utils.py").write_bytes((TP_DIR / "log_utils.py").read_bytes())
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(tmp_path / "job.py"), str(tmp_path), str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=300, env=_env())
    _check(proc)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in MODEL:
            theirs, ours = got[f"torch {name}"], got[f"pt_dist {name}"]
            assert theirs.count(" output sum ") == 10 and theirs.count(".weight ") == 2, theirs
            assert f"example on rank {rank}." in theirs
            assert ours == theirs, (rank, name)
            sums = [line for line in theirs.splitlines() if " output sum " in line]
            assert len(set(s.split()[-1] for s in sums)) > 1  # AdamW moved the weights between iterations
