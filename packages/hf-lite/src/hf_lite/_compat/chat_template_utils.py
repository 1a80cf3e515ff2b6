"""Chat templates: render a conversation with the Jinja template stored in tokenizer_config.json.

Same environment as transformers: sandboxed, ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a
``tojson`` that does not HTML-escape, and the ``raise_exception`` / ``strftime_now`` helpers templates call.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class TemplateError(ValueError):
    """Raised by a template's ``raise_exception`` or when a template does not compile."""


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=32)
def compile_chat_template(chat_template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(chat_template)
    except jinja2.TemplateSyntaxError as err:
        raise TemplateError(f"chat template does not compile: {err} (line {err.lineno})") from err


def render_chat(
    conversation: list[dict],
    chat_template: str,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    **template_kwargs,
) -> str:
    if not isinstance(conversation, (list, tuple)) or not all(isinstance(m, dict) for m in conversation):
        raise ValueError("a conversation must be a list of {'role': ..., 'content': ...} dicts")
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")
    messages = list(conversation)
    if continue_final_message:
        final = messages[-1].get("content") if messages else None
        if not isinstance(final, str):
            raise ValueError("continue_final_message: the final message has no text content to continue")
        # A tag after the final message marks where it ends, its trailing spaces included (transformers).
        messages[-1] = {**messages[-1], "content": final + _CONTINUE_TAG}
    rendered = compile_chat_template(chat_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    if continue_final_message:
        if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise ValueError("continue_final_message: the final message's content does not appear in the rendered chat")
        # Cut everything the template appended after the final message (its end-of-turn tokens).
        at = rendered.rindex(_CONTINUE_TAG.strip())
        kept = rendered[at: at + len(_CONTINUE_TAG)] == _CONTINUE_TAG  # the template kept the message's spacing
        rendered = rendered[:at] if kept else rendered[:at].rstrip()
    return rendered


def render_conversations(
    conversation, chat_template, add_generation_prompt, continue_final_message, special_tokens, template_kwargs
) -> tuple[list[str], bool]:
    """One conversation or a batch of them, rendered; and whether it was a batch."""
    if chat_template is None:
        raise ValueError("Cannot use apply_chat_template because this tokenizer does not have a chat template.")
    batched = bool(conversation) and isinstance(conversation[0], (list, tuple))
    conversations = conversation if batched else [conversation]
    rendered = [
        render_chat(
            c, chat_template, add_generation_prompt, continue_final_message, **special_tokens, **template_kwargs
        )
        for c in conversations
    ]
    return rendered, batched
