"""pt_dist under a real ``torchrun``, the way users launch it (and go multi-node).

torchrun's agent already serves torch's own TCPStore on MASTER_PORT (``TORCHELASTIC_USE_AGENT_STORE``), so
``init_process_group`` over ``env://`` must rendezvous beside it rather than bind the same port; each
init/destroy cycle must find its own store, not a stale one from the previous cycle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

JOB = """
import json, os, sys, torch, pt_dist

rank, out = int(os.environ["RANK"]), []
for backend in ("tcp", "shm", "gloo", "tcp"):
    pt_dist.init_process_group(backend, timeout=30)  # env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    t = torch.ones(4) * (pt_dist.get_rank() + 1)
    pt_dist.all_reduce(t)
    out.append([backend, pt_dist.get_rank(), pt_dist.get_world_size(), t.tolist()])
    pt_dist.barrier()
    pt_dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
"""


def test_init_process_group_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path)], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == [[b, rank, 2, [3.0] * 4] for b in ("tcp", "shm", "gloo", "tcp")]
