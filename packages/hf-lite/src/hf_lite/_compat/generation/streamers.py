"""Streamers (transformers' ``generation/streamers.py``): receive tokens as ``generate`` produces them."""

from __future__ import annotations

from queue import Queue


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
        self.next_tokens_are_prompt = False
        self.token_cache.extend(value.tolist())
        text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
        if text.endswith("\n"):
            printable = text[self.print_len :]
            self.token_cache, self.print_len = [], 0
        elif text.endswith("\ufffd"):
            # An incomplete UTF-8 sequence: wait for the bytes that finish the character.
            printable = ""
        else:
            # Hold back the last partial word: a later token may still change how it decodes.
            cut = text.rfind(" ") + 1
            printable = text[self.print_len : cut] if cut > self.print_len else ""
            self.print_len += len(printable)
        self.on_finalized_text(printable)

    def end(self) -> None:
        if self.token_cache:
            text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
            printable = text[self.print_len :]
        else:
            printable = ""
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
        if text:
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
