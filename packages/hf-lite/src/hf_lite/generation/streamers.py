"""``hf_lite.generation.streamers`` (transformers' ``generation/streamers.py``): in
``_compat/generation/streamers.py``; ``generate`` calls a streamer's ``put`` / ``end`` and nothing else."""

from .._compat.generation.streamers import (
    AsyncTextIteratorStreamer,
    BaseStreamer,
    TextIteratorStreamer,
    TextStreamer,
)

__all__ = ["AsyncTextIteratorStreamer", "BaseStreamer", "TextIteratorStreamer", "TextStreamer"]
