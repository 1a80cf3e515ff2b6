"""When ZeRO-3 gathers, prefetches and releases each submodule's parameters (DeepSpeed's
``PartitionedParameterCoordinator`` in ``deepspeed/runtime/zero/partitioned_param_coordinator.py``).

The first step records the order modules run in (the trace), per phase. Later steps follow it: at
each module the next ones' parameters are gathered asynchronously, up to ``prefetch_bucket_size``
elements and never beyond ``max_live_parameters`` live; a module's parameters are kept after it ran
when the trace shows them used again within ``max_reuse_distance`` elements (tied weights). Anything
that runs off the trace (a data-dependent branch, an activation-checkpoint recompute) is gathered on
demand and does not disturb it.
"""

from __future__ import annotations

import contextlib

import torch

from ds_zero.runtime.zero.partition_parameters import (
    ZeroParamStatus,
    gather_params,
    is_zero_param,
    release_param,
)

_off_trace_depth = 0


@contextlib.contextmanager
def off_trace():
    """Fetches inside are on demand and unrecorded, for every coordinator: activation checkpointing wraps its
    recompute in this, as DeepSpeed keeps recompute out of its step trace."""
    global _off_trace_depth
    _off_trace_depth += 1
    try:
        yield
    finally:
        _off_trace_depth -= 1


class PartitionedParameterCoordinator:
    def __init__(self, prefetch_bucket_size: int, max_live_parameters: int, max_reuse_distance: int = 0,
                 swapper=None):
        self.prefetch_bucket_size = int(prefetch_bucket_size)
        self.max_live_parameters = int(max_live_parameters)
        self.max_reuse_distance = int(max_reuse_distance)
        self.swapper = swapper  # NVMe parameter offload: reads a partition in before it is gathered
        self.trace = {"fwd": [], "bwd": []}
        self.trace_complete = False
        self.position = {"fwd": 0, "bwd": 0}
        self.inflight: dict[int, object] = {}  # param ds_id -> AllGatherHandle
        self.all_params: list[torch.nn.Parameter] = []
        self._keep: dict[str, list[set[int]]] = {}  # per phase, per trace position: ds_ids reused soon
        self._at: dict[int, int] = {}  # id(module) -> its trace position in the current pass

    @staticmethod
    def _own(module) -> list:
        return [p for p in module.parameters(recurse=False) if is_zero_param(p)]

    def live_numel(self) -> int:
        return sum(p.ds_numel for p in self.all_params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)

    @property
    def recomputing(self) -> bool:
        return _off_trace_depth > 0

    def fetch_sub_module(self, module, phase: str) -> None:
        params = self._own(module)
        for p in params:
            handle = self.inflight.pop(p.ds_id, None)
            if handle is not None:
                handle.wait()
                for q in list(self.inflight):
                    if self.inflight[q] is handle:
                        del self.inflight[q]
        gather_params(params)  # reads NVMe partitions in first (waiting for a prefetch already under way)
        if self.recomputing:
            return
        if not self.trace_complete:
            self._at[id(module)] = len(self.trace[phase])
            self.trace[phase].append(module)
        else:
            self._prefetch(module, phase)

    def _prefetch(self, module, phase: str) -> None:
        trace = self.trace[phase]
        pos = self.position[phase]
        if pos >= len(trace) or trace[pos] is not module:
            return  # the order changed; fall back to on-demand gathers for this pass
        self._at[id(module)] = pos
        self.position[phase] = pos + 1
        budget, live, todo = self.prefetch_bucket_size, self.live_numel(), []
        for nxt in trace[pos + 1:]:
            for p in self._own(nxt):
                if p.ds_status != ZeroParamStatus.NOT_AVAILABLE or any(p is q for q in todo):
                    continue
                if p.ds_numel > budget or live + p.ds_numel > self.max_live_parameters:
                    budget = -1
                    break
                todo.append(p)
                budget -= p.ds_numel
                live += p.ds_numel
            if budget <= 0:
                break
        if todo:
            if self.swapper is not None:
                self.swapper.swap_in(todo, async_op=True)
                return  # the read overlaps; the gather happens when the module asks
            handle = gather_params(todo, async_op=True)
            for p in todo:
                self.inflight[p.ds_id] = handle

    def release_sub_module(self, module, phase: str = "fwd", keep_ids=frozenset()) -> None:
        keep = set()
        if self.trace_complete and not self.recomputing and id(module) in self._at:
            positions = self._keep.get(phase, [])
            at = self._at[id(module)]
            keep = positions[at] if at < len(positions) else set()
        for p in self._own(module):
            if p.ds_id not in self.inflight and p.ds_id not in keep and id(p) not in keep_ids:
                release_param(p)

    def _compute_reuse(self) -> None:
        """Per trace position, the params used again before ``max_reuse_distance`` more elements are fetched."""
        for phase, trace in self.trace.items():
            keep = []
            for i, module in enumerate(trace):
                mine, found, traversed = {p.ds_id for p in self._own(module)}, set(), 0
                for nxt in trace[i + 1:]:
                    if traversed >= self.max_reuse_distance or not mine - found:
                        break
                    own = self._own(nxt)
                    found |= mine & {p.ds_id for p in own}
                    traversed += sum(p.ds_numel for p in own)
                keep.append(found)
            self._keep[phase] = keep

    def begin_phase(self, phase: str) -> None:
        self.position[phase] = 0
        self._at.clear()
        if not self.trace_complete:
            self.trace[phase] = []

    def end_phase(self, phase: str) -> None:
        """After a full forward or backward: finish prefetches, release everything not persistent."""
        for handle in {id(h): h for h in self.inflight.values()}.values():
            handle.wait()
        self.inflight.clear()
        if self.swapper is not None:
            self.swapper.drain()
        for p in self.all_params:
            release_param(p)
        self.position[phase] = 0
        if phase == "bwd" and self.trace["fwd"] and not self.trace_complete:
            self.trace_complete = True
            self._compute_reuse()
