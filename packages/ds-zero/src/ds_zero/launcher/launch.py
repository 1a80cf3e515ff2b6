"""One node's torchrun launch (DeepSpeed's ``deepspeed/launcher/launch.py``); it lives in
:mod:`ds_zero._compat.launcher.launch`."""

from ds_zero._compat.launcher.launch import RANK_ENTRY, RANK_ENTRY_PATH, NodeLaunch, exit_code_of, run_torchrun

__all__ = ["RANK_ENTRY", "RANK_ENTRY_PATH", "NodeLaunch", "exit_code_of", "run_torchrun"]
