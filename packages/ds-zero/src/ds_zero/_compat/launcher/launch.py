"""One node's launch: the torchrun command line for a node, and running it here.

DeepSpeed's ``deepspeed/launcher/launch.py`` spawns a node's ranks itself; here torchrun
(``torch.distributed.run``) does, with the static rendezvous at ``master_addr:master_port``, and
each rank goes through :mod:`ds_zero.launcher.local_rank`, which hands the script
``--local_rank=N``. Remote nodes are printed ``-m ds_zero.launcher.local_rank``; the local run
starts that file by its path, so a rank imports nothing of ds_zero before the user's script does.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import signal

logger = logging.getLogger(__name__)

RANK_ENTRY = "ds_zero.launcher.local_rank"
RANK_ENTRY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_rank.py")


@dataclasses.dataclass
class NodeLaunch:
    """What one node runs: its place in the job and the accelerator ids (slots) its ranks get."""

    host: str
    node_rank: int
    nnodes: int
    slots: list[int]
    master_addr: str
    master_port: int
    first_rank: int
    world_size: int

    @property
    def nproc(self) -> int:
        return len(self.slots)

    def env(self) -> dict[str, str]:
        # DeepSpeed's launch.py sets the accelerator's visible-devices variable to the node's slots.
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(s) for s in self.slots)}

    def torchrun_args(self, user_script: str, user_args: list[str], *, module: bool = False,
                      no_python: bool = False, no_local_rank: bool = False, local: bool = False) -> list[str]:
        """torchrun's arguments (without the program name) for this node; ``local``: for this machine."""
        entry_flags = [flag for flag, on in (("--module", module), ("--no_python", no_python),
                                             ("--no_local_rank", no_local_rank)) if on]
        return [f"--nnodes={self.nnodes}", f"--node-rank={self.node_rank}", f"--nproc-per-node={self.nproc}",
                f"--master-addr={self.master_addr}", f"--master-port={self.master_port}",
                *([RANK_ENTRY_PATH] if local else ["-m", RANK_ENTRY]), *entry_flags, user_script, *user_args]

    def shell_command(self, torchrun_args: list[str], cwd: str) -> str:
        """The line a user pastes on this node's shell."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items())
        return f"cd {shlex.quote(cwd)} && {env} {shlex.join(['torchrun', *torchrun_args])}"


def exit_code_of(exitcode: int) -> int:
    """A rank's exit status as a shell reports it (a signal ``-s`` becomes ``128 + s``)."""
    return 128 - exitcode if exitcode < 0 else exitcode


def quiet_torchrun(level: int) -> None:
    """torchrun's agent logs at ``level``, but its INFO chatter only at DEBUG (``--quiet`` silences its warnings)."""
    agent_level = level if level >= logging.WARNING or level == logging.DEBUG else logging.WARNING
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.run", "torch.distributed.elastic")):
            logging.getLogger(name).setLevel(agent_level)


def run_torchrun(node: NodeLaunch, torchrun_args: list[str], log_level: int = logging.INFO) -> int:
    """Run torchrun for ``node`` in this process; the first failed rank's exit code, else 0."""
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    quiet_torchrun(log_level)
    os.environ.update(node.env())
    logger.info("cmd = torchrun %s", shlex.join(torchrun_args))
    try:
        torchrun.run(torchrun.parse_args(torchrun_args))
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        code = exit_code_of(failure.exitcode)
        logger.error("rank %d exited with %s; launcher exits with %d", rank,
                     failure.signal_name() if failure.exitcode < 0 else failure.exitcode, code)
        return code or 1
    except SignalException as err:  # the agent was sent SIGTERM/SIGINT; torchrun stopped the ranks
        logger.error("launcher received %s, ranks stopped", err.sigval.name)
        return 128 + int(err.sigval)
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    return 0
