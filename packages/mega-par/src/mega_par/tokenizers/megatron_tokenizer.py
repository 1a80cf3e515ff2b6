"""Upstream's ``megatron.core.tokenizers.megatron_tokenizer``, kept so Megatron's scripts run;
the code is ``mega_par._compat.tokenizers.megatron_tokenizer``."""

from mega_par._compat.tokenizers.megatron_tokenizer import MegatronTokenizer

__all__ = ["MegatronTokenizer"]
