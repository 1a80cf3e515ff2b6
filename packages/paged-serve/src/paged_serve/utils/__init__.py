"""vLLM's ``vllm.utils`` names the scripts use: ``FlexibleArgumentParser`` (argparse taking ``--flag_name`` too)."""

from paged_serve._compat.arg_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
