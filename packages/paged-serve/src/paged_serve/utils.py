"""``FlexibleArgumentParser`` (vLLM ``vllm/utils``): argparse that also takes ``--flag_name`` for ``--flag-name``."""

from __future__ import annotations

import argparse
import sys


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vLLM's scripts build their command lines with it; underscores in a long option become dashes."""

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        fixed = []
        for arg in args:
            if arg.startswith("--") and "_" in arg:
                name, eq, value = arg.partition("=")
                arg = name.replace("_", "-") + eq + value
            fixed.append(arg)
        return super().parse_args(fixed, namespace)
