"""``hf_lite.hf_argparser`` (transformers' ``hf_argparser.py``): ``HfArgumentParser``, in
``_compat/hf_argparser.py``."""

from ._compat.hf_argparser import HfArgumentParser, string_to_bool

__all__ = ["HfArgumentParser", "string_to_bool"]
