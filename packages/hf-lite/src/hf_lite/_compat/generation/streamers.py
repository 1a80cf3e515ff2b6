"""Streamers (transformers' ``generation/streamers.py``): receive tokens as ``generate`` produces them."""

from __future__ import annotations

import asyncio
import unicodedata
from queue import Queue

# The CJK Unified Ideographs blocks (and extensions, compatibility ideographs): each character is a word.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


class BaseStreamer:
    """``put(token_ids)`` is called with the prompt first, then each new token; ``end()`` once at the end."""

    def put(self, value) -> None:
        raise TypeError(f"{type(self).__name__} is abstract; subclasses implement put")

    def end(self) -> None:
        raise TypeError(f"{type(self).__name__} is abstract; subclasses implement end")


class TextStreamer(BaseStreamer):
    """Decode incrementally and print whole words as soon as they are final (batch size 1)."""

    def __init__(self, tokenizer, skip_prompt: bool = False, **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.decode_kwargs = decode_kwargs
        self.token_cache: list[int] = []
        self.print_len = 0
        self.next_tokens_are_prompt = True

    def put(self, value) -> None:
        if value.dim() > 1 and value.shape[0] > 1:
            raise ValueError("TextStreamer only supports batch size 1")
        if value.dim() > 1:
            value = value[0]
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.token_cache.extend(value.tolist())
        text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
        pending = text[self.print_len :]
        if text.endswith("\n"):
            # Keep the newline's token: the next token may decode differently after it.
            printable = pending
            self.token_cache = self.token_cache[-1:]
            self.print_len = len(self.tokenizer.decode(self.token_cache[-1], **self.decode_kwargs))
        elif (text and _is_cjk(ord(text[-1]))) or all(
                c.isspace() or unicodedata.category(c)[0] in "LMN" for c in pending):
            printable = pending  # CJK characters and whole letters/digits are final as they come
            self.print_len += len(printable)
        else:
            # Hold back the last partial word (punctuation, an incomplete UTF-8 sequence...).
            printable = text[self.print_len : text.rfind(" ") + 1]
            self.print_len += len(printable)
        self.on_finalized_text(printable)

    def end(self) -> None:
        printable = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)[self.print_len :] \
            if self.token_cache else ""
        self.token_cache, self.print_len = [], 0
        self.next_tokens_are_prompt = True
        self.on_finalized_text(printable, stream_end=True)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        print(text, flush=True, end="" if not stream_end else None)


class TextIteratorStreamer(TextStreamer):
    """Hand finalised text to another thread through a queue; iterate over it (``timeout`` per item)."""

    def __init__(self, tokenizer, skip_prompt: bool = False, timeout: float | None = None, **decode_kwargs):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue: Queue = Queue()
        self.stop_signal = None
        self.timeout = timeout

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.text_queue.put(text, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        value = self.text_queue.get(timeout=self.timeout)
        if value is self.stop_signal:
            raise StopIteration
        return value


class AsyncTextIteratorStreamer(TextStreamer):
    """``TextIteratorStreamer`` for asyncio: ``generate`` runs in a thread, an ``async for`` over the streamer reads
    the text on the event loop that created it (``timeout`` per item raises ``TimeoutError``)."""

    def __init__(self, tokenizer, skip_prompt: bool = False, timeout: float | None = None, **decode_kwargs):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue: asyncio.Queue = asyncio.Queue()
        self.stop_signal = None
        self.timeout = timeout
        self.loop = asyncio.get_running_loop()

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.loop.call_soon_threadsafe(self.text_queue.put_nowait, text)
        if stream_end:
            self.loop.call_soon_threadsafe(self.text_queue.put_nowait, self.stop_signal)

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        value = await asyncio.wait_for(self.text_queue.get(), self.timeout)
        if value == self.stop_signal:
            raise StopAsyncIteration()
        return value
