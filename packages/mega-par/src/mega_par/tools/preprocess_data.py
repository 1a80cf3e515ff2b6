"""Megatron-LM's ``tools/preprocess_data.py`` (``python -m mega_par.tools.preprocess_data``); the tool lives in
``mega_par._compat.tools.preprocess_data``."""

from mega_par._compat.tools.preprocess_data import get_args, main

__all__ = ["get_args", "main"]

if __name__ == "__main__":
    main()
