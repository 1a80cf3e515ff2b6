"""What the drop-in example tests share: the header mark, the line swaps, the sha256 check, the launch env, and
the start of their torchrun job scripts."""

from __future__ import annotations

import hashlib
import os
import pathlib

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
MARK = "# pt-dist drop-in <<<\n"


def _swap(text: str, pairs, what: str) -> str:
    """Replace each ``(ours, theirs)`` in the body (after the header), each the stated number of times."""
    head, body = text.split(MARK, 1)
    for ours, theirs, count in pairs:
        assert body.count(ours) == count, f"{what}: {ours!r} should appear {count} times"
        body = body.replace(ours, theirs)
    return head + MARK + body


def _upstream_sha(text: str) -> str:
    return hashlib.sha256(text.split(MARK, 1)[1].encode()).hexdigest()


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONWARNINGS"] = "ignore::UserWarning"  # pin_memory without an accelerator
    return env


def _check(proc):
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


# The start of a torchrun job script (run as a file in each rank, not under pytest): the agent's store, and a
# fresh rendezvous port per run, because torch's env:// re-init on the agent's store reads stale keys.
JOB_PRELUDE = """
import os, socket
import torch

agent = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)


def fresh_master_port(rank, name):
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            agent.set(name, str(s.getsockname()[1]))
    os.environ["MASTER_PORT"] = agent.get(name).decode()
"""
