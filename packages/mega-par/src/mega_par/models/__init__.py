"""Models built from mega_par layers."""

from mega_par.models.gpt import GPTModel

__all__ = ["GPTModel"]
