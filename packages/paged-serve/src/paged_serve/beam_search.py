"""vLLM's ``vllm/beam_search.py`` path: the types of ``LLM.beam_search`` live in ``paged_serve._compat``."""

from paged_serve._compat.beam_search_offline import (
    BeamSearchInstance,
    BeamSearchOutput,
    BeamSearchSequence,
    create_sort_beams_key_function,
    get_beam_search_score,
)

__all__ = [
    "BeamSearchInstance",
    "BeamSearchOutput",
    "BeamSearchSequence",
    "create_sort_beams_key_function",
    "get_beam_search_score",
]
