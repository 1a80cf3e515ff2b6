"""``hf_lite.generation.streamers`` (transformers' ``generation/streamers.py``): in
``_compat/generation/streamers.py``; ``generate`` calls a streamer's ``put`` / ``end`` and nothing else."""

from .._compat.generation.streamers import BaseStreamer, TextIteratorStreamer, TextStreamer

__all__ = ["BaseStreamer", "TextIteratorStreamer", "TextStreamer"]
