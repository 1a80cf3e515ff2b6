"""Whether a tensor's saved chunks tile it (torch's ``default_planner._validate_global_plan`` checks; no pt_dist
imports): every chunk (anything with ``offsets`` and ``sizes``) lies inside the tensor's ``size``, no two
overlap, and, when the chunks must cover the tensor, their volumes add up to its volume. A planner bug or two
ranks disagreeing about a sharding is caught before anything is written."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["tiling_errors"]


def tiling_errors(key: str, size: Sequence[int], chunks: Sequence, must_cover: bool) -> list[str]:
    errors, volume = [], 0
    for i, chunk in enumerate(chunks):
        if any(o < 0 or s < 0 or o + s > n for o, s, n in zip(chunk.offsets, chunk.sizes, size)):
            errors.append(f"key:{key} has out of bounds chunk: tensor-size:{size} chunk: {chunk}")
        volume += math.prod(chunk.sizes)
        for other in chunks[:i]:
            if all(max(a, b) < min(a + m, b + n)
                   for a, m, b, n in zip(chunk.offsets, chunk.sizes, other.offsets, other.sizes)):
                errors.append(f"key:{key} has overlapping chunks: {chunk} {other}")
    if must_cover and volume != math.prod(size):
        errors.append(f"key:{key} invalid fill tensor-volume: {math.prod(size)} chunks-volume: {volume}")
    return errors
