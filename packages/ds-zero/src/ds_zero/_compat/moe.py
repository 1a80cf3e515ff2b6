"""``deepspeed.moe``: the parameter-group helpers scripts import (``deepspeed/moe/utils.py``), which sort expert
parameters (``param.allreduce == False``, ``param.group_name`` their expert data-parallel group) into groups of
their own; and ``deepspeed.moe.layer.MoE``, which ds_zero does not build: constructing it raises, naming it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch


def is_moe_param(param: torch.Tensor) -> bool:
    return hasattr(param, "allreduce") and not param.allreduce


def is_moe_param_group(param_group: dict) -> bool:
    return param_group.get("moe", False)


def split_params_into_shared_and_expert_params(params) -> tuple[list, list]:
    params = list(params)
    return [p for p in params if not is_moe_param(p)], [p for p in params if is_moe_param(p)]


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size: int | float | None = 178956971
                                                         ) -> list[dict[str, Any]]:
    """Each group (it needs a ``name``) keeps its shared parameters; its expert parameters move to new groups, one
    per expert data-parallel group name (``moe: True``), cut into pieces of at most ``max_group_size`` elements."""
    if isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif not isinstance(param_groups, list):
        raise ValueError(f"Unknown param group type of {type(param_groups)}")
    names = sorted({p.group_name for g in param_groups for p in g["params"] if is_moe_param(p)})
    moe_groups: dict[str, dict[str, dict]] = defaultdict(dict)
    for group in param_groups:
        for key in names:
            moe_groups[group["name"]][key] = {**group, "name": key, "moe": True, "params": []}
    for group in param_groups:
        shared = []
        for p in group["params"]:
            (moe_groups[group["name"]][p.group_name]["params"] if is_moe_param(p) else shared).append(p)
        group["params"] = shared
    for by_name in moe_groups.values():
        for group in by_name.values():
            if max_group_size is None:
                param_groups.append(group)
                continue
            pieces, size = [[]], 0
            for p in group["params"]:
                n = getattr(p, "ds_numel", p.numel())
                if pieces[-1] and size + n > max_group_size:
                    pieces.append([])
                    size = 0
                pieces[-1].append(p)
                size += n
            param_groups.extend({**group, "params": piece} for piece in pieces if piece)
    return param_groups


class MoE(torch.nn.Module):
    """``deepspeed.moe.layer.MoE`` (Mixture of Experts with expert parallelism): not built in ds_zero."""

    def __init__(self, hidden_size: int, expert: torch.nn.Module, num_experts: int = 1, ep_size: int = 1, k: int = 1,
                 *args, **kwargs):
        raise NotImplementedError(
            f"deepspeed.moe.layer.MoE(hidden_size={hidden_size}, num_experts={num_experts}, ep_size={ep_size}, k={k}) "
            "is not implemented in ds_zero: expert parallelism and MoE gating are not built here"
        )
