"""When ZeRO-3 gathers, prefetches and releases each submodule's parameters (DeepSpeed's
``PartitionedParameterCoordinator`` in ``deepspeed/runtime/zero/partitioned_param_coordinator.py``).

One trace per training step, as DeepSpeed's ``__submodule_order``: every module fetch of a forward and
the backward after it, in the order they happen, an activation-checkpoint recompute included (it runs
inside backward, so it lands in the backward part). The first step records it; later steps validate
each fetch against it (a mismatch invalidates it and the next step records again) and follow it: at
each module the next ones' parameters are gathered asynchronously, up to ``prefetch_bucket_size``
elements and never beyond ``max_live_parameters`` live. A module's parameters stay gathered after it
ran when the trace uses them again within ``max_reuse_distance`` elements, across the forward/backward
boundary too (so a model within the distance is gathered once per step). ``max_live_parameters`` bounds
what is kept: a fetch or prefetch that needs room releases kept parameters, those used last first.
"""

from __future__ import annotations

import bisect
import enum
import logging

import torch

from ds_zero.runtime.zero.partition_parameters import (
    ZeroParamStatus,
    gather_params,
    is_zero_param,
    release_param,
)

logger = logging.getLogger(__name__)


class ZeroTraceMode(enum.Enum):
    """DeepSpeed's ``ZeRoTraceMode``."""

    RECORD = 1  # this step's fetches are being recorded
    COMPLETE = 2  # a recorded trace drives prefetching and reuse
    INVALID = 3  # the trace did not match; on demand until the next step records again


class PartitionedParameterCoordinator:
    def __init__(self, prefetch_bucket_size: int, max_live_parameters: int, max_reuse_distance: int = 0,
                 swapper=None):
        self.prefetch_bucket_size = int(prefetch_bucket_size)
        self.max_live_parameters = int(max_live_parameters)
        self.max_reuse_distance = int(max_reuse_distance)
        self.swapper = swapper  # NVMe parameter offload: reads a partition in before it is gathered
        self.mode = ZeroTraceMode.INVALID  # the first step's begin_phase("fwd") starts recording
        self.order: list[torch.nn.Module] = []  # the step's module fetches, forward then backward
        self.fwd_len = 0  # how many of them the forward made
        self.step_id = 0  # fetches so far in this step
        self.recordings = 0  # traces completed (1 on a static model)
        self.inflight: dict[int, object] = {}  # param ds_id -> AllGatherHandle
        self.all_params: list[torch.nn.Parameter] = []
        self._uses: dict[int, list[int]] = {}  # ds_id -> the trace positions whose module uses it
        self._cum: list[int] = [0]  # elements fetched by order[:i]
        self._kept: dict[int, torch.nn.Parameter] = {}  # ds_id -> gathered, not in use, reused soon
        self._horizon = -1  # the furthest trace position the prefetcher has looked at in this step

    @staticmethod
    def _own(module) -> list:
        return [p for p in module.parameters(recurse=False) if is_zero_param(p)]

    @property
    def trace(self) -> dict[str, list]:
        """The step trace split where backward began."""
        return {"fwd": self.order[:self.fwd_len], "bwd": self.order[self.fwd_len:]}

    def live_numel(self) -> int:
        return sum(p.ds_numel for p in self.all_params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)

    # --- the step trace (DeepSpeed's trace_prologue / record_module / reset_step) -------------------------
    def begin_phase(self, phase: str) -> None:
        """``"fwd"``: a step starts (DeepSpeed's ``reset_step`` at the root's forward); ``"bwd"``: its backward."""
        if phase == "fwd":
            self.step_id, self._horizon = 0, -1
            if self.mode != ZeroTraceMode.COMPLETE:
                self.mode, self.order, self.fwd_len = ZeroTraceMode.RECORD, [], 0
        elif self.mode == ZeroTraceMode.RECORD:
            self.fwd_len = len(self.order)

    def end_phase(self, phase: str) -> None:
        """After a backward, or a forward with no backward to come: finish prefetches, release everything not
        persistent; a recorded training step becomes the trace."""
        self._drain()
        self._kept.clear()
        for p in self.all_params:
            release_param(p)
        if self.mode == ZeroTraceMode.RECORD:
            if phase == "bwd" and self.order:
                self._complete()
            else:  # an inference forward is no training step: record the next one
                self.order, self.fwd_len = [], 0
        self.step_id, self._horizon = 0, -1

    def _complete(self) -> None:
        self.mode = ZeroTraceMode.COMPLETE
        self.recordings += 1
        self._uses, self._cum = {}, [0]
        for i, module in enumerate(self.order):
            own = self._own(module)
            for p in own:
                self._uses.setdefault(p.ds_id, []).append(i)
            self._cum.append(self._cum[-1] + sum(p.ds_numel for p in own))
        logger.debug("ZeRO-3 trace recorded: %d module fetches (%d forward)", len(self.order), self.fwd_len)

    def _check_trace(self, module) -> None:
        if self.step_id < len(self.order) and self.order[self.step_id] is module:
            return
        logger.info("ZeRO-3 trace invalidated at fetch %d (%s): the module order changed; recording again next "
                    "step", self.step_id, type(module).__name__)
        self.mode = ZeroTraceMode.INVALID
        mine = {p.ds_id for p in self._own(module)}
        for p in self._drain() + list(self._kept.values()):
            if p.ds_id not in mine:
                release_param(p)
        self._kept.clear()

    def _drain(self) -> list:
        """Wait for every prefetch; return the params they gathered."""
        handles = {id(h): h for h in self.inflight.values()}.values()
        done = [p for h in handles for p in h.params]
        for h in handles:
            h.wait()
        self.inflight.clear()
        if self.swapper is not None:
            self.swapper.drain()
        return done

    # --- fetch and release -----------------------------------------------------------------------------
    def fetch_sub_module(self, module, phase: str) -> None:
        if self.mode == ZeroTraceMode.COMPLETE:
            self._check_trace(module)
        if self.mode == ZeroTraceMode.RECORD:
            self.order.append(module)
        params = self._own(module)
        for p in params:
            self._kept.pop(p.ds_id, None)  # in use again
        need = sum(p.ds_numel for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE
                   and p.ds_id not in self.inflight)
        if need:
            self._evict(self.live_numel(), need)
        for p in params:
            handle = self.inflight.pop(p.ds_id, None)
            if handle is not None:
                for q in handle.params:
                    self.inflight.pop(q.ds_id, None)
                handle.wait()
        gather_params(params)  # reads NVMe partitions in first (waiting for a prefetch already under way)
        if self.mode == ZeroTraceMode.COMPLETE:
            self._prefetch(self.step_id)
        self.step_id += 1

    def _prefetch(self, pos: int) -> None:
        """Gather the next modules' params asynchronously, added while the bucket holds fewer than
        ``prefetch_bucket_size`` elements (DeepSpeed's rule: the last one may overflow it), never beyond
        ``max_live_parameters`` live."""
        room, live, todo, full = self.prefetch_bucket_size, self.live_numel(), [], False
        # One pass over the trace per step, as DeepSpeed's fetch queue: what lies before the horizon was
        # gathered or skipped as gathered (and is kept until used, see _reused_soon).
        for j in range(max(pos, self._horizon) + 1, len(self.order)):
            for p in self._own(self.order[j]):
                if room <= 0:
                    full = True
                    break
                if p.ds_status != ZeroParamStatus.NOT_AVAILABLE or any(p is q for q in todo):
                    continue
                if live + p.ds_numel > self.max_live_parameters:
                    live = self._evict(live, p.ds_numel, used_after=j)
                    if live + p.ds_numel > self.max_live_parameters:
                        full = True
                        break
                todo.append(p)
                room -= p.ds_numel
                live += p.ds_numel
            if full:
                break
            self._horizon = max(self._horizon, j)  # every use up to here is gathered or skipped as gathered
        if todo:
            if self.swapper is not None:
                self.swapper.swap_in(todo, async_op=True)
                return  # the read overlaps; the gather happens when the module asks
            handle = gather_params(todo, async_op=True)
            for p in todo:
                self.inflight[p.ds_id] = handle

    def _next_use(self, p) -> float:
        uses = self._uses.get(p.ds_id, [])
        i = bisect.bisect_left(uses, self.step_id)
        return uses[i] if i < len(uses) else float("inf")

    def _evict(self, live: int, need: int, used_after: float = -1) -> int:
        """Release kept params, the latest-used first (those used after trace position ``used_after`` only),
        until ``need`` more elements fit under ``max_live_parameters``; returns the live count left."""
        for p in sorted(self._kept.values(), key=self._next_use, reverse=True):
            if live + need <= self.max_live_parameters or self._next_use(p) <= used_after:
                break
            del self._kept[p.ds_id]
            release_param(p)
            live -= p.ds_numel
        return live

    def _reused_soon(self, p) -> bool:
        """Is ``p`` used again before ``max_reuse_distance`` more elements are fetched, or at a use the
        prefetcher already passed over because ``p`` was gathered (DeepSpeed's ``__params_to_release``)?"""
        j = self._next_use(p)
        if j == float("inf"):
            return False
        return j <= self._horizon or self._cum[j] - self._cum[self.step_id] < self.max_reuse_distance

    def release_sub_module(self, module, phase: str = "fwd", keep_ids=frozenset()) -> None:
        params = [p for p in self._own(module) if p.ds_id not in self.inflight and id(p) not in keep_ids
                  and p.ds_status == ZeroParamStatus.AVAILABLE and not p.ds_persist]
        complete = self.mode == ZeroTraceMode.COMPLETE
        live = self.live_numel() if complete and params else 0
        for p in params:
            if complete and live <= self.max_live_parameters and self._reused_soon(p):
                self._kept[p.ds_id] = p
                continue
            release_param(p)
            live -= p.ds_numel
