"""The per-rank step: run the user's script with ``--local_rank=N`` as DeepSpeed's ``launch.py`` does.

torchrun starts ``python -u -m ds_zero.launcher.local_rank [FLAGS] SCRIPT ARGS...`` once per rank
with ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set. This module adds
the variables DeepSpeed's launcher exports besides (``LOCAL_SIZE``, ``CROSS_RANK``, ``CROSS_SIZE``),
then runs ``SCRIPT --local_rank=N ARGS...`` in this same interpreter (``--module``: as
``python -m``; ``--no_python``: exec'd as a program). FLAGS are ``--no_local_rank``,
``--module``, ``--no_python``, read only before SCRIPT.
"""

from __future__ import annotations

import os
import runpy
import sys

FLAGS = ("--no_local_rank", "--module", "--no_python")


def split_argv(argv: list[str]) -> tuple[set[str], str, list[str]]:
    """``[FLAGS..., SCRIPT, ARGS...]`` -> ``(flags, SCRIPT, ARGS)``."""
    flags = set()
    i = 0
    while i < len(argv) and argv[i] in FLAGS:
        flags.add(argv[i])
        i += 1
    if i == len(argv):
        raise SystemExit("ds_zero.launcher.local_rank: no training script given")
    return flags, argv[i], argv[i + 1:]


def script_argv(flags: set[str], script: str, args: list[str], local_rank: int) -> list[str]:
    """The script's argv: DeepSpeed's launch.py puts ``--local_rank=N`` right after the script."""
    if "--module" in flags and "--no_python" in flags:
        raise SystemExit("Don't use both the '--no_python' flag and the '--module' flag at the same time.")
    extra = [] if "--no_local_rank" in flags else [f"--local_rank={local_rank}"]
    return [script, *extra, *args]


def main(argv: list[str] | None = None) -> None:
    flags, script, args = split_argv(sys.argv[1:] if argv is None else argv)
    env = os.environ
    # The names DeepSpeed's launch.py exports next to torch's own (constants.CROSS_RANK/CROSS_SIZE).
    env.setdefault("LOCAL_SIZE", env.get("LOCAL_WORLD_SIZE", "1"))
    env.setdefault("CROSS_RANK", env.get("GROUP_RANK", "0"))
    env.setdefault("CROSS_SIZE", env.get("GROUP_WORLD_SIZE", "1"))
    new_argv = script_argv(flags, script, args, int(env.get("LOCAL_RANK", "0")))
    if "--no_python" in flags:
        os.execvp(script, new_argv)
    sys.argv = new_argv
    # sys.path[0] as `python -m MODULE` (the working directory) or `python SCRIPT` (its directory) has it.
    if "--module" in flags:
        sys.path[0] = os.getcwd()
        runpy.run_module(script, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
