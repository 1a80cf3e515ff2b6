"""vLLM v0's ``engine`` path of the in-engine beam search (``_compat/beam_search.py``)."""

from paged_serve._compat.beam_search import BeamSearchProcessor, BeamState

__all__ = ["BeamSearchProcessor", "BeamState"]
