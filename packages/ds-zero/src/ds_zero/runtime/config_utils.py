"""Value checks shared by every config section (DeepSpeed's ``deepspeed/runtime/config_utils.py``).

A bad value raises :class:`DeepSpeedConfigError` naming the key, the value and what is allowed. A key a
section does not know is an error in the sections DeepSpeed validates with pydantic (``extra="forbid"``:
``zero_optimization`` and its offload sub-sections, ``fp16``, ``bf16``), so a typo never trains with the
default; elsewhere (the top level, ``optimizer.params``, ...) DeepSpeed reads keys one by one and ignores the
rest, and so do we, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("ds_zero.config")


class DeepSpeedConfigError(ValueError):
    """A config value is not allowed (or a required key is missing)."""


def config_err(key: str, value: Any, allowed: str) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(f"config key {key!r} has invalid value {value!r}; allowed: {allowed}")


def where(section: str) -> str:
    return f"in {section!r}" if section else "at the top level"


def split_keys(section: str, d: Any, allowed: set, strict: bool = False) -> dict:
    """Check ``d`` is an object and return only its ``allowed`` keys; other keys are logged, or with ``strict``
    refused naming the key and the allowed ones."""
    if not isinstance(d, dict):
        raise config_err(section or "config", d, "a JSON object")
    unknown = sorted(set(d) - allowed)
    if strict and unknown:
        raise DeepSpeedConfigError(
            f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} {where(section)}; "
            f"allowed: {sorted(allowed)}")
    for key in unknown:
        logger.warning("unknown config key %r %s ignored; known keys: %s", key, where(section), sorted(allowed))
    return {k: v for k, v in d.items() if k in allowed}


def as_bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise config_err(key, v, "true or false")
    return v


def as_int(key: str, v: Any, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
        raise config_err(key, v, f"an integer >= {minimum}")
    return int(v)


def as_float(key: str, v: Any, minimum: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
        raise config_err(key, v, f"a number >= {minimum:g}")
    return float(v)
