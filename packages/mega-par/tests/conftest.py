"""One 8-rank run serves the whole package: the layer cases and every 3D training job share the spawned ranks.

Each rank process pays for importing torch (and torch._dynamo, which torch.optim pulls in); on a 2-core
machine those imports cost more than the tests. Under pytest-xdist the run happens once per session: the first
worker that needs it produces it under a file lock in the shared temp directory, the others read it.
"""

import importlib.util
import os
import pathlib
import sys

import pytest
import torch
from filelock import FileLock

from harness import run_ranks

HERE = pathlib.Path(__file__).resolve().parent


def load_test_module(stem: str):
    """Import a test module of this directory by path under a stable name (ranks import it the same way)."""
    name = f"mega_par_tests_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{stem}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _produce(root: pathlib.Path) -> dict:
    save_dir = root / "mega_par_ckpt"
    save_dir.mkdir(exist_ok=True)
    jobs = load_test_module("test_gpt_3d")._rank_jobs
    return {"save_dir": str(save_dir), "per_rank": run_ranks(jobs, 8, str(save_dir), backend=None, timeout=480)}


@pytest.fixture(scope="session")
def mega_par_ranks(tmp_path_factory) -> dict:
    """{"save_dir": checkpoints of the 3D jobs, "per_rank": each rank's results}."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = root / "mega_par_ranks.pt"
    with FileLock(str(out) + ".lock"):
        if not out.exists():
            tmp = root / "mega_par_ranks.pt.tmp"
            torch.save(_produce(root), tmp)
            tmp.replace(out)
        return torch.load(out, weights_only=False)
