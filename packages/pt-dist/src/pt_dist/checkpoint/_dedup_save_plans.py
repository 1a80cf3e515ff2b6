"""The coordinator's dedup (torch's checkpoint/_dedup_save_plans.py): an item several ranks offer (a replicated
tensor, a Replicate()d DTensor block, a non-tensor object, all under the same key and offset) is written by one
of them, the rank with the fewest bytes planned so far (or the lowest rank), so the data lands once and the
writing is spread over the ranks."""

from __future__ import annotations

import dataclasses

from .planner import SavePlan

__all__ = ["dedup_save_plans"]


def dedup_save_plans(all_plans: list[SavePlan], save_to_lowest_rank: bool = False) -> list[SavePlan]:
    holders: dict = {}  # index -> the ranks offering it, in rank order
    items: dict = {}
    for rank, plan in enumerate(all_plans):
        for item in plan.items:
            holders.setdefault(item.index, []).append(rank)
            items[item.index] = item
    planned = [0] * len(all_plans)
    writer = {}
    for index, ranks in holders.items():
        pick = ranks[0] if save_to_lowest_rank else min(ranks, key=lambda r: planned[r])
        writer[index] = pick
        planned[pick] += items[index].tensor_storage_size() or 1
    return [dataclasses.replace(plan, items=[it for it in plan.items if writer[it.index] == rank])
            for rank, plan in enumerate(all_plans)]
