"""Nested state dicts flattened to one level (torch's checkpoint/_nested_dict.py and _traverse.py):
``{"optim": {"state": {"w": {"exp_avg": t}}}}`` becomes ``{"optim.state.w.exp_avg": t}`` with the mapping back
to the path ``("optim", "state", "w", "exp_avg")``. A list is walked into only if it holds tensors or dicts
(a list of numbers stays one pickled value), a tuple never: torch's rules, so the keys are torch's keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

OBJ_PATH = tuple[str | int, ...]
FLATTEN_MAPPING = dict[str, OBJ_PATH]


def _is_leaf(value: Any) -> bool:
    if isinstance(value, Mapping):
        return False
    return not isinstance(value, list) or all(_is_leaf(v) and not isinstance(v, torch.Tensor) for v in value)


def flatten_state_dict(state_dict: Mapping) -> tuple[dict[str, Any], FLATTEN_MAPPING]:
    """Every leaf under its dotted key, in the dicts' order, and each key's path."""
    flat: dict[str, Any] = {}
    mapping: FLATTEN_MAPPING = {}

    def walk(path: OBJ_PATH, value: Any) -> None:
        if _is_leaf(value):
            key = ".".join(map(str, path))
            if key in flat:
                raise ValueError(f"duplicated flatten key {key}")
            flat[key], mapping[key] = value, path
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(path + (str(k),), v)
        else:
            for i, v in enumerate(value):
                walk(path + (i,), v)

    for key, value in state_dict.items():
        walk((str(key),), value)
    return flat, mapping


def set_element(root: dict, path: OBJ_PATH, value: Any) -> None:
    """``root[path[0]][path[1]]... = value``, creating dicts (str keys) and lists (int keys) on the way."""
    node: Any = root
    for key, nxt in zip(path[:-1], path[1:]):
        empty = {} if isinstance(nxt, str) else []
        if isinstance(node, Mapping):
            node = node.setdefault(key, empty)
        else:
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = empty
            node = node[key]
    if isinstance(path[-1], int):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value

