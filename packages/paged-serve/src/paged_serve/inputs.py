"""vLLM's prompt forms (``vllm/inputs/data.py``): ``PromptType`` is a string, a ``TextPrompt`` or a ``TokensPrompt``.

``parse_prompts`` turns whatever ``LLM.generate`` / ``LLMEngine.add_request`` were given (one prompt or a list, or
the older ``prompt_token_ids=`` list of id lists) into ``(text, token_ids)`` pairs, exactly one side set, and
raises ``TypeError`` naming the type of anything else.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TypedDict


class TextPrompt(TypedDict):
    """A text prompt, tokenized by the engine."""

    prompt: str


class TokensPrompt(TypedDict):
    """A prompt given as token ids (nothing is tokenized)."""

    prompt_token_ids: list[int]


PromptType = str | TextPrompt | TokensPrompt

_EXPECTED = "a string, a TextPrompt {'prompt': str} or a TokensPrompt {'prompt_token_ids': [int, ...]} (PromptType)"


def _is_token_id(t) -> bool:
    """An int, or any integer type (numpy, a 0-d torch tensor) that ``operator.index`` takes; never a bool."""
    try:
        operator.index(t)
    except TypeError:
        return False
    return not isinstance(t, bool)


def _is_ids(value) -> bool:
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
            if not _is_ids(ids):
                raise TypeError(f"prompt_token_ids must be a list of ints, got {type(ids).__name__}")
            return None, [operator.index(t) for t in ids]
        if "prompt" in prompt:
            if not isinstance(prompt["prompt"], str):
                raise TypeError(f"TextPrompt 'prompt' must be a str, got {type(prompt['prompt']).__name__}")
            return prompt["prompt"], None
        raise TypeError(f"a prompt dict needs 'prompt' or 'prompt_token_ids' (keys: {sorted(prompt)}): {_EXPECTED}")
    raise TypeError(f"a prompt must be {_EXPECTED}, got {type(prompt).__name__}")


def parse_prompts(prompts, prompt_token_ids: Sequence[Sequence[int]] | None = None) -> list[tuple]:
    """Every prompt ``LLM.generate`` was given, in order; a bare list of ints is one tokens prompt."""
    if (prompts is None) == (prompt_token_ids is None):
        raise ValueError("give exactly one of prompts and prompt_token_ids")
    if prompt_token_ids is not None:
        if _is_ids(prompt_token_ids):
            prompt_token_ids = [prompt_token_ids]
        return [parse_prompt({"prompt_token_ids": list(ids)}) for ids in prompt_token_ids]
    if isinstance(prompts, (str, dict)):
        return [parse_prompt(prompts)]
    if _is_ids(prompts) and prompts:
        return [parse_prompt({"prompt_token_ids": prompts})]
    if isinstance(prompts, (list, tuple)):
        return [parse_prompt({"prompt_token_ids": p}) if _is_ids(p) and p else parse_prompt(p) for p in prompts]
    raise TypeError(f"prompts must be a PromptType or a list of them ({_EXPECTED}), got {type(prompts).__name__}")
