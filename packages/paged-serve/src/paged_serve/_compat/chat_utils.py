"""Chat messages to a prompt (vLLM ``entrypoints/chat_utils.py``), for ``LLM.chat`` and ``serve --chat-template``.

``load_chat_template`` reads a template given as a file or inline; ``resolve_chat_template_content_format`` decides
whether the template wants ``content`` as a string or as OpenAI's list of parts (by looking for a loop over
``message['content']`` in the template); ``parse_chat_messages`` brings every message to that form;
``apply_hf_chat_template`` renders it as transformers' ``apply_chat_template`` does, ``continue_final_message``
included (the rendered text ends where the final message's content ends, so the model continues it).
"""

from __future__ import annotations

import logging
from pathlib import Path

from jinja2 import Environment, nodes

from paged_serve.transformers_utils.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

CONTENT_FORMATS = ("auto", "string", "openai")
_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # marks the final message's end through the render (transformers' tag)


def load_chat_template(chat_template: str | Path | None) -> str | None:
    """A template file's text, or the template itself when given inline (vLLM's ``--chat-template``)."""
    if chat_template is None:
        return None
    path = Path(chat_template)
    try:
        if path.is_file():
            return path.read_text()
    except OSError:  # an inline template longer than a path may be
        pass
    text = str(chat_template)
    if not any(c in text for c in "{}\n"):
        raise ValueError(f"chat template {text!r} is neither a file nor a Jinja template")
    return text


def _loops_over_content(template: str) -> bool:
    """Whether the template iterates over ``message['content']`` / ``message.content`` (OpenAI's parts form)."""
    tree = Environment().parse(template)
    for loop in tree.find_all(nodes.For):
        target = loop.iter
        if isinstance(target, nodes.Filter):  # `for part in message['content'] | selectattr(...)`
            target = target.node
        if isinstance(target, nodes.Getitem) and isinstance(target.arg, nodes.Const) and target.arg.value == "content":
            return True
        if isinstance(target, nodes.Getattr) and target.attr == "content":
            return True
    return False


def resolve_chat_template_content_format(
    chat_template: str | None, tools, given_format: str, tokenizer: Tokenizer
) -> str:
    """``"string"`` or ``"openai"``: the given format, or under ``"auto"`` the one the template reads."""
    if given_format not in CONTENT_FORMATS:
        raise ValueError(f"chat_template_content_format must be one of {CONTENT_FORMATS}, got {given_format!r}")
    if given_format != "auto":
        return given_format
    template = chat_template or tokenizer.chat_template
    return "openai" if template and _loops_over_content(template) else "string"


def _text_parts(content, index: int) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise ValueError(f"message {index}: content part of type {kind!r} is not supported (text-only models)")
        texts.append(part["text"])
    return texts


def parse_chat_messages(messages: list[dict], content_format: str) -> list[dict]:
    """Each message with ``content`` as one string ("string", parts joined by newlines) or as text parts."""
    conversation = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise TypeError(f"message {i} must be a dict with a 'role', got {message!r}")
        message = dict(message)
        content = message.get("content")
        if content is not None:
            texts = _text_parts(content, i)
            if content_format == "string":
                message["content"] = "\n".join(texts)
            else:
                message["content"] = [{"type": "text", "text": t} for t in texts]
        conversation.append(message)
    return conversation


def _mark_final_message(conversation: list[dict]) -> str:
    """Append the tag to the final message's (last text part of) content; returns that content."""
    if not conversation or conversation[-1].get("content") is None:
        raise ValueError("continue_final_message is set but the final message has no content to continue")
    final = conversation[-1] = dict(conversation[-1])
    if isinstance(final["content"], str):
        text, final["content"] = final["content"], final["content"] + _TAG
        return text
    parts = final["content"] = [dict(p) for p in final["content"]]
    text = parts[-1]["text"]
    parts[-1]["text"] = text + _TAG
    return text


def apply_hf_chat_template(
    tokenizer: Tokenizer,
    conversation: list[dict],
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict] | None = None,
    **kwargs,
) -> str:
    """The conversation rendered by the chat template, as transformers' ``apply_chat_template(tokenize=False)``."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible: set one of them")
    if chat_template is None and tokenizer.chat_template is None:
        raise ValueError(
            "the model's tokenizer has no chat template and none was given: pass chat_template= (or --chat-template)"
        )
    if continue_final_message:
        conversation = list(conversation)
        final = _mark_final_message(conversation)
    rendered = tokenizer.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, chat_template=chat_template, tools=tools, **kwargs
    )
    if not continue_final_message:
        return rendered
    if final.strip() not in rendered or _TAG.strip() not in rendered:
        raise ValueError("continue_final_message is set but the template drops the final message's content")
    cut = rendered.rindex(_TAG.strip())
    if rendered[cut : cut + len(_TAG)] == _TAG:
        return rendered[:cut]
    return rendered[:cut].rstrip()  # the template trimmed the final message's trailing space
