"""The ``ds-zero`` command, DeepSpeed's ``deepspeed`` runner (``deepspeed/launcher/runner.py``); it lives in
:mod:`ds_zero._compat.launcher.runner`."""

import sys

from ds_zero._compat.launcher.runner import build_parser, check_args, main, plan_nodes, resolve_resources

__all__ = ["build_parser", "check_args", "main", "plan_nodes", "resolve_resources"]

if __name__ == "__main__":
    sys.exit(main())
