"""``deepspeed.add_config_arguments``: the command-line flags DeepSpeed's scripts add to their parser
(``deepspeed/__init__.py``'s ``_add_core_arguments``). ``initialize(args=...)`` reads ``--deepspeed_config``
(or the deprecated ``--deepscale_config``); ``--deepspeed`` / ``--deepscale`` are flags for the user's code."""

from __future__ import annotations

import argparse


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (a flag for user code; the engine does not read it)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated spelling of --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated spelling of --deepspeed_config")
    return parser


def config_from_args(args):
    """The config path ``args`` names: ``deepspeed_config``, else the deprecated ``deepscale_config``."""
    path = getattr(args, "deepspeed_config", None)
    old = getattr(args, "deepscale_config", None)
    if path is not None and old is not None:
        raise ValueError(f"args give both --deepspeed_config={path!r} and --deepscale_config={old!r}; use one")
    return path if path is not None else old
