"""``Scheduler`` (vLLM v0 ``vllm/core/scheduler.py``): which sequences run in the next step, and with which blocks.

Iteration-level scheduling (Orca, OSDI'22): every step re-decides the batch, so requests join and leave at token
granularity. Three queues: ``waiting`` (not admitted, or preempted by recompute), ``running`` and ``swapped``.
Without chunked prefill a step is either all prefills (waiting groups admitted FCFS under the token and sequence
budgets, none while anything is swapped out) or all decodes (one token per running sequence, then swapped groups
brought back). With chunked prefill (Sarathi-Serve) running decodes and prefill chunks go first, then swapped
groups, then new prompts fill what is left of the token budget, a long prompt in several chunks. When blocks run
out, the most recently admitted groups are preempted: by recompute (blocks freed, group requeued at the front,
prefilled again with its generated tokens) or by swap (blocks copied to the CPU pool; the default for groups of
several sequences, whose shared blocks recompute would not share again).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from paged_serve.config import CacheConfig, SchedulerConfig
from paged_serve.core.block_manager import AllocStatus, BlockSpaceManager
from paged_serve.core.scheduling_budget import SchedulingBudget
from paged_serve.core.sequence import Sequence, SequenceGroup, SequenceGroupMetadata, SequenceStatus

logger = logging.getLogger(__name__)


@dataclass
class ScheduledSequenceGroup:
    seq_group: SequenceGroup
    token_chunk_size: int  # tokens computed this step per sequence (decode: 1)


@dataclass
class SchedulerOutputs:
    scheduled_seq_groups: list[ScheduledSequenceGroup]
    num_prefill_groups: int
    num_batched_tokens: int
    blocks_to_swap_in: list[tuple[int, int]]
    blocks_to_swap_out: list[tuple[int, int]]
    blocks_to_copy: list[tuple[int, int]]
    ignored_seq_groups: list[SequenceGroup]
    num_lookahead_slots: int
    running_queue_size: int
    preempted: int
    preempted_seq_groups: list[SequenceGroup] = field(default_factory=list)
    num_preempted_by_recompute: int = 0
    num_preempted_by_swap: int = 0

    def is_empty(self) -> bool:
        return not (self.scheduled_seq_groups or self.blocks_to_swap_in or self.blocks_to_swap_out)


class _StepState:
    """The lists one ``schedule`` call fills in."""

    def __init__(self):
        self.prefills: list[ScheduledSequenceGroup] = []
        self.decodes: list[ScheduledSequenceGroup] = []
        self.ignored: list[SequenceGroup] = []
        self.preempted: list[SequenceGroup] = []
        self.swapped_out: list[SequenceGroup] = []
        self.swap_in: list[tuple[int, int]] = []
        self.swap_out: list[tuple[int, int]] = []
        self.copy: list[tuple[int, int]] = []
        self.num_recompute = 0
        self.num_swap = 0


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, lora_config=None):
        if lora_config is not None:
            raise ValueError("LoRA is not supported by paged_serve's scheduler")
        if cache_config.num_gpu_blocks is None or cache_config.num_cpu_blocks is None:
            raise ValueError("cache_config.num_gpu_blocks and num_cpu_blocks must be set before the scheduler")
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.block_manager = BlockSpaceManager(
            cache_config.block_size,
            cache_config.num_gpu_blocks,
            cache_config.num_cpu_blocks,
            watermark=cache_config.watermark,
            enable_caching=cache_config.enable_prefix_caching,
        )
        self.waiting: deque[SequenceGroup] = deque()
        self.running: deque[SequenceGroup] = deque()
        self.swapped: deque[SequenceGroup] = deque()
        self.num_preemptions = {"recompute": 0, "swap": 0}
        self.num_cumulative_preemption = 0
        # scheduler_delay_factor: when the last prompt step was scheduled, and how long that step took
        self.prev_time, self.prev_prompt, self.last_prompt_latency = 0.0, False, 0.0

    # ------------------------------------------------------------- requests
    def add_seq_group(self, seq_group: SequenceGroup) -> None:
        self.waiting.append(seq_group)

    def abort_seq_group(self, request_id: str | Iterable[str]) -> list[SequenceGroup]:
        """Abort requests in any state: their unfinished sequences end ABORTED and their blocks are freed."""
        ids = {request_id} if isinstance(request_id, str) else set(request_id)
        aborted = []
        for queue in (self.waiting, self.running, self.swapped):
            for group in [g for g in queue if g.request_id in ids]:
                queue.remove(group)
                for seq in group.get_seqs():
                    if not seq.is_finished():
                        seq.status = SequenceStatus.FINISHED_ABORTED
                    self.free_seq(seq)
                aborted.append(group)
        return aborted

    def has_unfinished_seqs(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def get_num_unfinished_seq_groups(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def fork_seq(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        self.block_manager.fork(parent_seq, child_seq)

    def free_seq(self, seq: Sequence) -> None:
        self.block_manager.free(seq)

    def free_finished_seq_groups(self) -> list[SequenceGroup]:
        finished = [g for g in self.running if g.is_finished()]
        self.running = deque(g for g in self.running if not g.is_finished())
        for group in finished:
            for seq in group.get_seqs():
                self.free_seq(seq)
        return finished

    # ------------------------------------------------------------- helpers
    def _preemption_mode(self, seq_group: SequenceGroup) -> str:
        mode = self.scheduler_config.preemption_mode
        if mode is None:
            mode = "recompute" if seq_group.get_max_num_running_seqs() == 1 else "swap"
        if mode == "swap" and not self.block_manager.can_swap_out(seq_group):
            logger.warning("not enough CPU swap space for request %s: preempting it by recompute", seq_group.request_id)
            mode = "recompute"
        return mode

    def _preempt(self, seq_group: SequenceGroup, step: _StepState) -> None:
        seq_group.metrics.num_preemptions += 1
        self.num_cumulative_preemption += 1
        mode = self._preemption_mode(seq_group)
        if seq_group.metrics.num_preemptions == 1:
            logger.warning(
                "Sequence group %s is preempted by PreemptionMode.%s mode because there is not enough KV cache "
                "space. This can affect the end-to-end performance. Increase num_gpu_blocks or "
                "kv_cache_memory_bytes to provide more KV cache memory. total_num_cumulative_preemption=%d",
                seq_group.request_id,
                mode.upper(),
                self.num_cumulative_preemption,
            )
        if mode == "recompute":
            for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
                seq.status = SequenceStatus.WAITING
                self.free_seq(seq)
                seq.reset_state_for_recompute()
            step.preempted.append(seq_group)
            step.num_recompute += 1
            self.num_preemptions["recompute"] += 1
        else:
            step.swap_out.extend(self.block_manager.swap_out(seq_group))
            for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
                seq.status = SequenceStatus.SWAPPED
            step.swapped_out.append(seq_group)
            step.num_swap += 1
            self.num_preemptions["swap"] += 1

    def _append_slots(self, seq_group: SequenceGroup, step: _StepState) -> None:
        for seq in seq_group.get_seqs(status=SequenceStatus.RUNNING):
            step.copy.extend(self.block_manager.append_slots(seq, self.scheduler_config.num_lookahead_slots))

    def _num_new_tokens(self, seq_group: SequenceGroup, status: SequenceStatus, budget: SchedulingBudget) -> int:
        """Tokens the group computes next step: one per decoding sequence, a prefill's remaining tokens (chunked to
        the token budget left when chunked prefill is on; multi-sequence prefills are never chunked)."""
        seqs = seq_group.get_seqs(status=status)
        num = sum(s.get_num_new_tokens() for s in seqs)
        if self.scheduler_config.enable_chunked_prefill and len(seqs) == 1 and seqs[0].is_prefill():
            num = min(num, budget.remaining_token_budget())
        return num

    def _ignore(self, seq_group: SequenceGroup, reason: str, step: _StepState) -> None:
        logger.warning("request %s ignored: %s", seq_group.request_id, reason)
        seq_group.ignored_reason = reason
        for seq in seq_group.get_unfinished_seqs():
            seq.status = SequenceStatus.FINISHED_IGNORED
            self.free_seq(seq)
        step.ignored.append(seq_group)

    @staticmethod
    def _chunk(seq_group: SequenceGroup, status: SequenceStatus, num_tokens: int) -> ScheduledSequenceGroup:
        seqs = seq_group.get_seqs(status=status)
        per_seq = num_tokens if len(seqs) == 1 else max(s.get_num_new_tokens() for s in seqs)
        return ScheduledSequenceGroup(seq_group, per_seq)

    # ------------------------------------------------------------- queues
    def _schedule_running(self, budget: SchedulingBudget, step: _StepState) -> None:
        """Decode (or continue the prefill of) running groups in arrival order, preempting from the back."""
        running = deque(sorted(self.running, key=lambda g: g.arrival_time))
        kept: list[SequenceGroup] = []
        while running:
            group = running[0]
            num_tokens = self._num_new_tokens(group, SequenceStatus.RUNNING, budget)
            if num_tokens == 0:
                break
            running.popleft()
            while not self.block_manager.can_append_slots(group, self.scheduler_config.num_lookahead_slots):
                budget.subtract_num_batched_tokens(group.request_id, num_tokens)
                budget.subtract_num_seqs(group.request_id, group.get_max_num_running_seqs())
                victim = running.pop() if running else group
                budget.subtract_num_seqs(victim.request_id, victim.get_max_num_running_seqs())
                self._preempt(victim, step)
                if victim is group:
                    break
            else:
                self._append_slots(group, step)
                scheduled = self._chunk(group, SequenceStatus.RUNNING, num_tokens)
                (step.prefills if group.is_prefill() else step.decodes).append(scheduled)
                budget.add_num_batched_tokens(group.request_id, num_tokens)
                budget.add_num_seqs(group.request_id, group.get_max_num_running_seqs())
                kept.append(group)
        self.running = deque(kept + list(running))

    def _schedule_swapped(self, budget: SchedulingBudget, step: _StepState) -> None:
        """Bring swapped groups back, earliest arrival first (FCFS), while blocks and budgets allow."""
        while self.swapped:
            group = self.swapped[0]
            status = self.block_manager.can_swap_in(group, self.scheduler_config.num_lookahead_slots)
            if status == AllocStatus.LATER:
                break
            if status == AllocStatus.NEVER:
                self.swapped.popleft()
                self._ignore(group, "its blocks plus its next token no longer fit the whole KV cache", step)
                continue
            # never chunked (vLLM's _schedule_swapped): a swapped prefill comes back whole or not at all
            num_tokens = sum(s.get_num_new_tokens() for s in group.get_seqs(status=SequenceStatus.SWAPPED))
            if not budget.can_schedule(num_tokens, group.get_max_num_running_seqs()):
                break
            self.swapped.popleft()
            step.swap_in.extend(self.block_manager.swap_in(group))
            for seq in group.get_seqs(status=SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
            self._append_slots(group, step)
            scheduled = self._chunk(group, SequenceStatus.RUNNING, num_tokens)
            (step.prefills if group.is_prefill() else step.decodes).append(scheduled)
            budget.add_num_batched_tokens(group.request_id, num_tokens)
            budget.add_num_seqs(group.request_id, group.get_max_num_running_seqs())
            self.running.append(group)

    def _schedule_prefills(self, budget: SchedulingBudget, step: _StepState) -> None:
        """Admit waiting groups first come, first served while the prompt fits the budgets and the cache."""
        config = self.scheduler_config
        if not self._passed_delay(time.time()):
            return
        while self.waiting:
            group = self.waiting[0]
            seqs = group.get_seqs(status=SequenceStatus.WAITING)
            longest = max(s.get_len() for s in seqs)
            num_seqs = group.get_max_num_running_seqs()
            if num_seqs > config.max_num_seqs:  # can never fit the sequence budget: must not block the queue
                self.waiting.popleft()
                reason = f"it needs {num_seqs} sequences, more than max_num_seqs={config.max_num_seqs}"
                self._ignore(group, reason, step)
                continue
            if longest > config.max_model_len:
                self.waiting.popleft()
                self._ignore(group, f"{longest} tokens exceed max_model_len={config.max_model_len}", step)
                continue
            if not config.enable_chunked_prefill and longest > config.max_num_batched_tokens:
                self.waiting.popleft()
                reason = f"{longest} tokens exceed max_num_batched_tokens={config.max_num_batched_tokens}"
                self._ignore(group, reason, step)
                continue
            status = self.block_manager.can_allocate(group)
            if status == AllocStatus.LATER:
                break
            if status == AllocStatus.NEVER:
                self.waiting.popleft()
                reason = f"{longest} tokens need more KV blocks than the whole cache holds"
                self._ignore(group, reason, step)
                continue
            cached = self.block_manager.get_num_cached_tokens(group)
            num_tokens = sum(s.get_len() for s in seqs) - cached * len(seqs)
            if config.enable_chunked_prefill and len(seqs) == 1:
                num_tokens = min(num_tokens, budget.remaining_token_budget())
            oversized = num_tokens > config.max_num_batched_tokens  # a re-prefilled fork: it runs in a step alone
            if not budget.can_schedule(num_tokens, num_seqs) and not (oversized and not budget.num_batched_tokens):
                break
            self.waiting.popleft()
            self.block_manager.allocate(group)
            computed = len(self.block_manager.get_common_computed_block_ids(seqs)) * self.cache_config.block_size
            for seq in seqs:
                seq.status = SequenceStatus.RUNNING
                seq.num_computed_tokens = 0
                seq.update_num_computed_tokens(computed)
            if len(seqs) == 1:
                num_tokens = min(num_tokens, seqs[0].get_num_uncomputed_tokens())
            step.prefills.append(self._chunk(group, SequenceStatus.RUNNING, num_tokens))
            budget.add_num_batched_tokens(group.request_id, num_tokens)
            budget.add_num_seqs(group.request_id, num_seqs)
            if group.metrics.first_scheduled_time is None:
                group.metrics.first_scheduled_time = time.time()
                group.num_cached_tokens = computed
            self.running.append(group)
        if step.prefills:
            self.prev_prompt = True

    def _passed_delay(self, now: float) -> bool:
        """vLLM's ``scheduler_delay_factor``: hold new prompts back until the oldest waiting one has waited
        ``delay_factor`` x the latency of the last prompt step (or nothing runs), so prompts batch up."""
        if self.prev_prompt:
            self.last_prompt_latency = now - self.prev_time
        self.prev_time, self.prev_prompt = now, False
        if self.scheduler_config.delay_factor > 0 and self.waiting:
            earliest = min(g.metrics.arrival_time for g in self.waiting)
            return now - earliest > self.scheduler_config.delay_factor * self.last_prompt_latency or not self.running
        return True

    # ------------------------------------------------------------- the step
    def schedule(self) -> tuple[list[SequenceGroupMetadata], SchedulerOutputs]:
        config = self.scheduler_config
        budget = SchedulingBudget(config.max_num_batched_tokens, config.max_num_seqs)
        step = _StepState()
        if config.enable_chunked_prefill:
            self._schedule_running(budget, step)
            if not step.preempted and not step.swapped_out:
                self._schedule_swapped(budget, step)
            self._schedule_prefills(budget, step)
        else:
            for group in self.running:  # running sequences hold their place in the sequence budget
                budget.add_num_seqs(group.request_id, group.get_max_num_running_seqs())
            if not self.swapped:
                self._schedule_prefills(budget, step)
            if not step.prefills:
                self._schedule_running(budget, step)
                if not step.preempted and not step.swapped_out:
                    self._schedule_swapped(budget, step)
        # requeued at the front, oldest first
        self.waiting.extendleft(sorted(step.preempted, key=lambda g: g.arrival_time, reverse=True))
        self.swapped = deque(sorted([*self.swapped, *step.swapped_out], key=lambda g: g.arrival_time))
        scheduled = step.prefills + step.decodes
        outputs = SchedulerOutputs(
            scheduled_seq_groups=scheduled,
            num_prefill_groups=len(step.prefills),
            num_batched_tokens=budget.num_batched_tokens,
            blocks_to_swap_in=step.swap_in,
            blocks_to_swap_out=step.swap_out,
            blocks_to_copy=step.copy,
            ignored_seq_groups=step.ignored,
            num_lookahead_slots=config.num_lookahead_slots,
            running_queue_size=len(self.running),
            preempted=len(step.preempted) + len(step.swapped_out),
            preempted_seq_groups=step.preempted + step.swapped_out,
            num_preempted_by_recompute=step.num_recompute,
            num_preempted_by_swap=step.num_swap,
        )
        return [self._metadata(s) for s in scheduled], outputs

    def _metadata(self, scheduled: ScheduledSequenceGroup) -> SequenceGroupMetadata:
        group = scheduled.seq_group
        seqs = group.get_seqs(status=SequenceStatus.RUNNING)
        is_prompt = group.is_prefill()
        # a prefill chunk that leaves tokens uncomputed produces no token yet
        do_sample = not is_prompt or any(s.get_num_uncomputed_tokens() <= scheduled.token_chunk_size for s in seqs)
        return SequenceGroupMetadata(
            request_id=group.request_id,
            is_prompt=is_prompt,
            seq_data={s.seq_id: s for s in seqs},
            sampling_params=group.sampling_params,
            block_tables={s.seq_id: self.block_manager.get_block_table(s) for s in seqs},
            token_chunk_size=scheduled.token_chunk_size,
            do_sample=do_sample,
            computed_block_nums=self.block_manager.get_common_computed_block_ids(seqs) if is_prompt else [],
        )

    def update_from_output(self, scheduler_outputs: SchedulerOutputs) -> None:
        """After the forward pass: the scheduled tokens have KV now; their full blocks become cacheable."""
        for scheduled in scheduler_outputs.scheduled_seq_groups:
            group = scheduled.seq_group
            group.update_num_computed_tokens(scheduled.token_chunk_size)
            seqs = group.get_seqs(status=SequenceStatus.RUNNING)
            if len(seqs) == 1:
                self.block_manager.mark_blocks_as_computed(group, seqs[0].num_computed_tokens)
            else:
                self.block_manager.mark_blocks_as_computed(group)
