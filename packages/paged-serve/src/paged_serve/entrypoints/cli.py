"""``paged-serve serve MODEL_DIR`` (vLLM's ``vllm serve``); the command lives in ``paged_serve._compat.cli``."""

from paged_serve._compat.cli import main, make_parser

__all__ = ["main", "make_parser"]

if __name__ == "__main__":
    main()
