"""vLLM's prompt forms (``vllm/inputs/data.py``): ``PromptType`` is a string, a ``TextPrompt`` or a ``TokensPrompt``.

``parse_prompt`` turns the prompt ``LLMEngine.add_request`` was given into ``(text, token_ids)``, exactly one side
set, and raises ``TypeError`` naming the type of anything else (``LLM.generate``'s lists of them, and its older
``prompt_token_ids=``, are in ``_compat/llm.py``).
"""

from __future__ import annotations

import operator
from typing import TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str


class TokensPrompt(TypedDict):
    """A prompt given as token ids (nothing is tokenized)."""

    prompt_token_ids: list[int]


PromptType = str | TextPrompt | TokensPrompt

PROMPT_FORMS = "a string, a TextPrompt {'prompt': str} or a TokensPrompt {'prompt_token_ids': [int, ...]} (PromptType)"


def _is_token_id(t) -> bool:
    """An int, or any integer type (numpy, a 0-d torch tensor) that ``operator.index`` takes; never a bool."""
    try:
        operator.index(t)
    except TypeError:
        return False
    return not isinstance(t, bool)


def is_token_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_token_id(t) for t in value)


def parse_prompt(prompt) -> tuple[str | None, list[int] | None]:
    """One ``PromptType`` -> (text, None) or (None, token ids)."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        if prompt.get("multi_modal_data") is not None:
            raise ValueError("multi_modal_data is not supported: paged_serve runs text-only models")
        if "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not is_token_ids(ids):
                raise TypeError(f"prompt_token_ids must be a list of ints, got {type(ids).__name__}")
            return None, [operator.index(t) for t in ids]
        if "prompt" in prompt:
            if not isinstance(prompt["prompt"], str):
                raise TypeError(f"TextPrompt 'prompt' must be a str, got {type(prompt['prompt']).__name__}")
            return prompt["prompt"], None
        raise TypeError(f"a prompt dict needs 'prompt' or 'prompt_token_ids' (keys: {sorted(prompt)}): {PROMPT_FORMS}")
    raise TypeError(f"a prompt must be {PROMPT_FORMS}, got {type(prompt).__name__}")
