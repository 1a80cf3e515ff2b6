"""Dataset utilities (``megatron/core/datasets/utils.py``)."""

import logging

logger = logging.getLogger(__name__)


def compile_helpers() -> None:
    """Upstream compiles its C++ index helpers (``build_sample_idx``, ``build_blending_indices``) with make;
    mega_par's are numpy (``gpt_dataset.py``, ``blended_megatron_dataset_builder.py``): nothing to compile."""
    logger.info("compile_helpers: mega_par's dataset helpers are numpy; nothing to compile")
