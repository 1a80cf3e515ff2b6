"""``AllocStatus`` (vLLM ``core/interfaces.py``): can a group's blocks be allocated (or swapped in) now?"""

from __future__ import annotations

import enum


class AllocStatus(enum.Enum):
    """OK: allocate now. LATER: not enough free blocks now. NEVER: the prompt can never fit this cache."""

    OK = enum.auto()
    LATER = enum.auto()
    NEVER = enum.auto()
