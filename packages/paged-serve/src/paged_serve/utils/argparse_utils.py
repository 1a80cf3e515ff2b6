"""vLLM's ``vllm/utils/argparse_utils.py`` path (where current vLLM scripts import ``FlexibleArgumentParser``)."""

from paged_serve._compat.arg_utils import FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
