"""The tokenizer of a Hugging Face model directory, through the Rust ``tokenizers`` library (vLLM ``get_tokenizer``).

tokenizer.json holds the model (BPE merges, pre-tokenizer, post-processor adding BOS where the model wants it);
tokenizer_config.json / special_tokens_map.json name the special tokens and carry the chat template (or
chat_template.jinja beside them). Chat templates are rendered with Jinja2 in a sandbox, with the helpers
transformers gives them (``raise_exception``, ``strftime_now``).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _RustTokenizer


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # transformers' AddedToken serialisation
        return value.get("content")
    return value


def _raise_exception(message):
    raise TemplateError(message)


class Tokenizer:
    """``encode`` / ``decode`` / ``apply_chat_template`` with transformers' special-token conventions."""

    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir!s} has no tokenizer.json (a fast tokenizer file is required)")
        self._tok = _RustTokenizer.from_file(str(path))
        config: dict = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            if (model_dir / name).is_file():
                config.update(json.loads((model_dir / name).read_text()))
        self.config = config
        self.bos_token = _token_str(config.get("bos_token"))
        self.eos_token = _token_str(config.get("eos_token"))
        self.pad_token = _token_str(config.get("pad_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        template = config.get("chat_template")
        if template is None and (model_dir / "chat_template.jinja").is_file():
            template = (model_dir / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: use the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self.all_special_ids = sorted(
            {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
            | {i for i in (self.bos_token_id, self.eos_token_id) if i is not None}
        )

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return len(self)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        ids = [t for t in token_ids if 0 <= t < len(self)]  # a vocabulary padded past the tokenizer's
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str | None]:
        return [self._tok.id_to_token(t) for t in token_ids]

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, chat_template: str | None = None, **kwargs
    ) -> str:
        chat_template = chat_template or self.chat_template
        if not chat_template:
            raise ValueError("this model's tokenizer has no chat template (tokenizer_config.json 'chat_template')")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        special = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or "", "pad_token": self.pad_token}
        return env.from_string(chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **special, **kwargs
        )


class IncrementalDetokenizer:
    """Text of a sequence's output tokens, decoded with a few prompt tokens in front (vLLM's prefix offset).

    Decoding output ids alone loses what depends on the token before (a SentencePiece word's leading space); a
    trailing U+FFFD is an incomplete UTF-8 character and is held back until its last byte arrives.
    """

    CONTEXT = 6

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.context = prompt_token_ids[-self.CONTEXT :]
        self.context_text = tokenizer.decode(self.context, skip_special_tokens)

    def text(self, output_token_ids: list[int], final: bool = False) -> str:
        full = self.tokenizer.decode(self.context + output_token_ids, self.skip_special_tokens)
        if full.startswith(self.context_text):
            text = full[len(self.context_text) :]
        else:
            text = self.tokenizer.decode(output_token_ids, self.skip_special_tokens)
        if not final:
            text = text.rstrip("\ufffd")
        return text
