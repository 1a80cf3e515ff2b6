"""Scheduler cases as vLLM's ``tests/core/test_scheduler.py`` asserts them, driven through ``schedule()``.

The engine's side of a step is simulated: after ``schedule`` the scheduled tokens are computed
(``update_from_output``) and each sampling sequence gets a token, so block counts and preemptions are exact.
"""

from __future__ import annotations

import time
from unittest.mock import MagicMock

import pytest
from paged_serve.config import CacheConfig, SchedulerConfig
from paged_serve.core import AllocStatus, Sequence, SequenceGroup, SequenceStatus
from paged_serve.core.scheduler import Scheduler
from paged_serve.sampling_params import SamplingParams

BLOCK = 4


def create_dummy_prompt(request_id: str, prompt_length: int, best_of: int = 1, arrival: float | None = None, first=0):
    seq = Sequence(int(request_id) * 100, list(range(first, first + prompt_length)), BLOCK)
    params = SamplingParams(n=1, best_of=best_of, temperature=1.0)
    group = SequenceGroup(request_id, [seq], arrival_time=arrival, sampling_params=params)
    return seq, group


def make_scheduler(num_gpu=8, num_cpu=8, max_tokens=64, max_seqs=4, max_model_len=16, **kw) -> Scheduler:
    cache = CacheConfig(BLOCK, watermark=0.0, enable_prefix_caching=kw.pop("prefix", False))
    cache.num_gpu_blocks, cache.num_cpu_blocks = num_gpu, num_cpu
    return Scheduler(SchedulerConfig(max_tokens, max_seqs, max_model_len, **kw), cache)


def groups(out):
    return [s.seq_group for s in out.scheduled_seq_groups]


def step(scheduler: Scheduler, token: int = 1):
    """One engine step: schedule, 'compute' the scheduled tokens, sample one token per sampling sequence; a group
    whose first sample needs best_of sequences forks them as the engine does."""
    metas, out = scheduler.schedule()
    scheduler.update_from_output(out)
    for meta, scheduled in zip(metas, out.scheduled_seq_groups):
        if not meta.do_sample:
            continue
        group = scheduled.seq_group
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        want = group.get_max_num_running_seqs()  # best_of before the first sample
        for seq in seqs:
            seq.append_token_id(token)
        for i in range(want - len(seqs)):
            child = seqs[0].fork(seqs[0].seq_id + 1 + i)
            scheduler.fork_seq(seqs[0], child)
            group.add(child)
    return metas, out


def test_scheduler_add_seq_group():
    scheduler = make_scheduler()
    for i in range(4):
        scheduler.add_seq_group(create_dummy_prompt(str(i), BLOCK)[1])
        assert scheduler.get_num_unfinished_seq_groups() == i + 1


def test_scheduler_schedule_simple():
    scheduler = make_scheduler()
    running = [create_dummy_prompt(str(i), BLOCK)[1] for i in range(4)]
    for g in running:
        scheduler.add_seq_group(g)
    metas, out = step(scheduler)
    assert set(groups(out)) == set(running) and out.num_batched_tokens == 4 * BLOCK
    assert not out.blocks_to_copy and not out.blocks_to_swap_in and not out.blocks_to_swap_out
    assert len(metas) == 4 and all(m.is_prompt and m.token_chunk_size == BLOCK for m in metas)
    metas, out = step(scheduler)
    assert set(groups(out)) == set(running) and out.num_batched_tokens == 4
    assert all(not m.is_prompt and m.token_chunk_size == 1 for m in metas)


def test_scheduler_prefill_prioritized():
    """A step is all prefills when a prompt can be admitted: the running decode waits one step."""
    scheduler = make_scheduler(num_gpu=16, max_tokens=30, max_seqs=2, max_model_len=30)
    _, a = create_dummy_prompt("1", 1)
    scheduler.add_seq_group(a)
    assert groups(step(scheduler)[1]) == [a]
    _, b = create_dummy_prompt("2", 30)
    scheduler.add_seq_group(b)
    assert groups(step(scheduler)[1]) == [b]
    assert groups(step(scheduler)[1]) == [a, b]


def test_scheduler_schedule_preempt_abort():
    """2 blocks, 2 one-block prompts: the second decode has no block, so the later group is preempted by recompute
    and comes back with its prompt plus the generated token (5 tokens) once the first is aborted."""
    scheduler = make_scheduler(num_gpu=2, num_cpu=2, max_seqs=2)
    seq_a, a = create_dummy_prompt("1", BLOCK)
    seq_b, b = create_dummy_prompt("2", BLOCK)
    scheduler.add_seq_group(a)
    scheduler.add_seq_group(b)
    metas, out = step(scheduler)
    assert groups(out) == [a, b] and out.num_batched_tokens == 2 * BLOCK and len(metas) == 2
    metas, out = step(scheduler)
    assert groups(out) == [a] and out.num_batched_tokens == 1 and out.preempted == 1
    assert out.num_preempted_by_recompute == 1 and not out.blocks_to_swap_out
    assert seq_b.status == SequenceStatus.WAITING and seq_b.num_computed_tokens == 0
    assert scheduler.get_num_unfinished_seq_groups() == 2
    scheduler.abort_seq_group("1")
    assert seq_a.status == SequenceStatus.FINISHED_ABORTED
    metas, out = step(scheduler)
    assert groups(out) == [b] and out.num_batched_tokens == 5  # 4 prompt + 1 generated, recomputed
    assert metas[0].is_prompt and scheduler.get_num_unfinished_seq_groups() == 1


def test_scheduler_max_seqs():
    scheduler = make_scheduler(max_seqs=2)
    all_groups = [create_dummy_prompt(str(i), BLOCK)[1] for i in range(4)]
    scheduler.add_seq_group(all_groups[0])
    assert groups(step(scheduler)[1]) == [all_groups[0]]
    assert groups(step(scheduler)[1]) == [all_groups[0]]
    scheduler.add_seq_group(all_groups[1])
    scheduler.add_seq_group(all_groups[2])
    assert groups(step(scheduler)[1]) == [all_groups[1]]  # one running + one admitted = max_num_seqs


def test_prefill_budgets_respected():
    scheduler = make_scheduler(num_gpu=64, max_tokens=60, max_seqs=8, max_model_len=60)
    for i in range(3):
        scheduler.add_seq_group(create_dummy_prompt(str(i), 60)[1])
    _, out = step(scheduler)
    assert len(groups(out)) == 1 and out.num_batched_tokens == 60  # 60-token budget: one prompt a step
    scheduler = make_scheduler(num_gpu=64, max_tokens=200, max_seqs=2, max_model_len=60)
    for i in range(3):
        scheduler.add_seq_group(create_dummy_prompt(str(i), 60)[1])
    _, out = step(scheduler)
    assert len(groups(out)) == 2 and out.num_batched_tokens == 120 and len(scheduler.waiting) == 1


def test_prompt_longer_than_context_is_ignored_with_a_reason():
    scheduler = make_scheduler(max_model_len=16)
    _, long = create_dummy_prompt("0", 17)
    _, ok = create_dummy_prompt("1", 4)
    scheduler.add_seq_group(long)
    scheduler.add_seq_group(ok)
    _, out = step(scheduler)
    assert out.ignored_seq_groups == [long] and groups(out) == [ok]
    assert "max_model_len=16" in long.ignored_reason
    assert long.get_seqs()[0].status == SequenceStatus.FINISHED_IGNORED
    assert scheduler.get_num_unfinished_seq_groups() == 1


def test_prompt_larger_than_the_whole_cache_is_never_admitted():
    scheduler = make_scheduler(num_gpu=2, max_model_len=64, max_tokens=64)
    _, huge = create_dummy_prompt("0", 12)  # 3 blocks > 2
    scheduler.add_seq_group(huge)
    _, out = step(scheduler)
    assert out.ignored_seq_groups == [huge] and "whole cache" in huge.ignored_reason
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 2


def test_later_waits_and_never_ignores():
    scheduler = make_scheduler()
    for i in range(3):
        scheduler.add_seq_group(create_dummy_prompt(str(i), 8)[1])
    scheduler.block_manager.can_allocate = MagicMock(return_value=AllocStatus.LATER)
    _, out = step(scheduler)
    assert not out.scheduled_seq_groups and not out.ignored_seq_groups and len(scheduler.waiting) == 3
    scheduler.block_manager.can_allocate = MagicMock(return_value=AllocStatus.NEVER)
    _, out = step(scheduler)
    assert len(out.ignored_seq_groups) == 3 and not scheduler.waiting


def test_decode_preemption_recomputes_from_the_back():
    """Request 1 cannot append: the most recently admitted (2) is preempted, then 1 itself; 0 decodes."""
    scheduler = make_scheduler(num_gpu=64, max_seqs=8, max_model_len=64)
    gs = [create_dummy_prompt(str(i), 8, arrival=float(i))[1] for i in range(3)]
    for g in gs:
        scheduler.add_seq_group(g)
    step(scheduler)
    scheduler.block_manager.can_append_slots = MagicMock(side_effect=lambda g, n: g.request_id != "1")
    _, out = step(scheduler)
    assert groups(out) == [gs[0]] and out.num_batched_tokens == 1
    assert out.preempted == 2 and out.num_preempted_by_recompute == 2 and not out.blocks_to_swap_out
    assert [g.request_id for g in scheduler.waiting] == ["1", "2"]  # requeued at the front, oldest first


def test_multi_sequence_groups_are_preempted_by_swap_and_come_back_first():
    """vLLM's test_swapped_out_prioritized: a best_of=2 group is swapped out, and swapped in before new prefills."""
    scheduler = make_scheduler(num_gpu=64, num_cpu=64, max_seqs=6, max_model_len=64)
    gs = [create_dummy_prompt(str(i), 8, best_of=2, arrival=float(i))[1] for i in range(3)]
    for g in gs:
        scheduler.add_seq_group(g)
    _, out = step(scheduler)
    assert len(groups(out)) == 3 and all(g.num_seqs() == 2 for g in gs)  # forked on the first sample
    real_can_append = scheduler.block_manager.can_append_slots
    scheduler.block_manager.can_append_slots = MagicMock(side_effect=lambda g, n: g.request_id != "2")
    _, out = step(scheduler)
    assert groups(out) == gs[:2] and out.num_batched_tokens == 4
    assert out.num_preempted_by_swap == 1 and out.blocks_to_swap_out and not out.blocks_to_swap_in
    assert all(s.status == SequenceStatus.SWAPPED for s in gs[2].get_seqs())
    swapped_out = list(out.blocks_to_swap_out)
    scheduler.block_manager.can_append_slots = real_can_append
    scheduler.add_seq_group(create_dummy_prompt("3", 8, best_of=2, arrival=3.0)[1])
    _, out = step(scheduler)
    assert groups(out) == gs and out.num_batched_tokens == 6  # 3 groups x 2 decodes; the new prompt waits
    # swap-in is the reverse mapping: the same CPU blocks come back (to whichever GPU blocks are free now)
    assert sorted(cpu for cpu, _ in out.blocks_to_swap_in) == sorted(cpu for _, cpu in swapped_out)
    assert len(scheduler.waiting) == 1


def test_cow_pairs_are_passed_through():
    scheduler = make_scheduler(num_gpu=64, max_model_len=64)
    _, g = create_dummy_prompt("1", 6, best_of=2)  # 6 tokens: the forked pair shares a partial block
    scheduler.add_seq_group(g)
    step(scheduler)
    _, out = step(scheduler)
    assert len(out.blocks_to_copy) == 1  # the first sibling to write copies the shared block; the second owns it
    src, dst = out.blocks_to_copy[0]
    tables = [scheduler.block_manager.get_block_table(s) for s in g.get_seqs()]
    assert src in [t[1] for t in tables] and dst in [t[1] for t in tables]


def test_abort_in_every_state_frees_everything():
    scheduler = make_scheduler(num_gpu=3, num_cpu=8, max_seqs=4, max_model_len=16)
    _, running = create_dummy_prompt("0", 4, arrival=0.0)
    _, swapped = create_dummy_prompt("1", 4, best_of=2, arrival=1.0)
    for g in (running, swapped):
        scheduler.add_seq_group(g)
    step(scheduler)
    step(scheduler)  # 3 blocks: the pair's next tokens open a block each; it is swapped out
    assert all(s.status == SequenceStatus.SWAPPED for s in swapped.get_seqs())
    _, waiting = create_dummy_prompt("2", 4)
    scheduler.add_seq_group(waiting)
    scheduler.abort_seq_group(["0", "1", "2", "unknown"])
    assert not scheduler.has_unfinished_seqs()
    assert all(s.status == SequenceStatus.FINISHED_ABORTED for g in (running, swapped, waiting) for s in g.get_seqs())
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 3
    assert scheduler.block_manager.get_num_free_cpu_blocks() == 8 and not scheduler.block_manager.block_tables


def test_infeasible_swap_in_is_ignored():
    scheduler = make_scheduler(num_gpu=64, num_cpu=64, max_seqs=4, max_model_len=64)
    _, g = create_dummy_prompt("1", 8, best_of=2)
    scheduler.add_seq_group(g)
    step(scheduler)
    scheduler.block_manager.can_append_slots = MagicMock(return_value=False)
    step(scheduler)
    assert g in scheduler.swapped
    scheduler.block_manager.can_swap_in = MagicMock(return_value=AllocStatus.NEVER)
    _, out = step(scheduler)
    assert out.ignored_seq_groups == [g] and not scheduler.swapped


def test_forced_recompute_of_a_forked_group_reprefills_each_sequence():
    scheduler = make_scheduler(num_gpu=64, max_seqs=4, max_model_len=64, preemption_mode="recompute")
    _, g = create_dummy_prompt("1", 6, best_of=2)
    scheduler.add_seq_group(g)
    step(scheduler)
    a, b = g.get_seqs()
    step(scheduler, token=7)
    b.output_token_ids[-1] = 9  # the siblings diverge
    scheduler.block_manager.can_append_slots = MagicMock(return_value=False)
    _, out = step(scheduler)
    assert out.num_preempted_by_recompute == 1 and all(s.status == SequenceStatus.WAITING for s in (a, b))
    del scheduler.block_manager.can_append_slots
    _, out = step(scheduler)
    assert groups(out) == [g] and out.num_batched_tokens == 2 * 8  # both sequences' 8 tokens, prefilled again
    ta, tb = (scheduler.block_manager.get_block_table(s) for s in (a, b))
    assert len(ta) == len(tb) == 2 and ta[0] == tb[0] and ta[1] != tb[1]  # common block 0 shared, block 1 not


@pytest.mark.parametrize("prefix", [False, True])
def test_chunked_prefill_splits_a_long_prompt_and_keeps_decodes_going(prefix):
    """vLLM's test_chunked_prefill_scheduler: decodes first, then a prompt in budget-sized chunks."""
    scheduler = make_scheduler(
        num_gpu=64, max_tokens=8, max_seqs=4, max_model_len=64, enable_chunked_prefill=True, prefix=prefix
    )
    _, short = create_dummy_prompt("0", 4, arrival=0.0)
    scheduler.add_seq_group(short)
    step(scheduler)
    long_seq, long = create_dummy_prompt("1", 20, arrival=1.0, first=100)
    scheduler.add_seq_group(long)
    sizes = []
    while long_seq.is_prefill():
        metas, out = step(scheduler)
        assert out.num_batched_tokens <= 8
        by_id = {m.request_id: m for m in metas}
        assert not by_id["0"].is_prompt and by_id["0"].token_chunk_size == 1  # the decode runs every step
        sizes.append(by_id["1"].token_chunk_size)
        assert by_id["1"].do_sample == (not long_seq.is_prefill())
    assert sizes == [7, 7, 6] and long_seq.get_output_len() == 1 and long_seq.num_computed_tokens == 20


def test_chunked_prefill_with_prefix_caching_skips_cached_blocks():
    scheduler = make_scheduler(
        num_gpu=64, max_tokens=64, max_seqs=4, max_model_len=64, enable_chunked_prefill=True, prefix=True
    )
    first_seq, first = create_dummy_prompt("0", 16)
    scheduler.add_seq_group(first)
    step(scheduler)
    again_seq, again = create_dummy_prompt("1", 16)
    scheduler.add_seq_group(again)
    metas, out = step(scheduler)
    meta = next(m for m in metas if m.request_id == "1")
    assert meta.token_chunk_size == 4 and len(meta.computed_block_nums) == 3  # 3 cached blocks skipped
    assert (
        scheduler.block_manager.get_block_table(again_seq)[:3] == scheduler.block_manager.get_block_table(first_seq)[:3]
    )


def test_a_group_wider_than_max_num_seqs_is_ignored_and_does_not_block_the_queue():
    """A head-of-queue group that can never fit the sequence budget used to stop FCFS admission for good."""
    scheduler = make_scheduler(num_gpu=64, max_seqs=2, max_model_len=64)
    _, wide = create_dummy_prompt("0", 4, best_of=3, arrival=0.0)
    _, ok = create_dummy_prompt("1", 4, arrival=1.0)
    scheduler.add_seq_group(wide)
    scheduler.add_seq_group(ok)
    _, out = step(scheduler)
    assert out.ignored_seq_groups == [wide] and groups(out) == [ok]
    assert "max_num_seqs=2" in wide.ignored_reason
    assert all(s.status == SequenceStatus.FINISHED_IGNORED for s in wide.get_seqs())


def test_swapped_groups_come_back_oldest_first():
    """vLLM swaps the earliest arrival back in first (FCFS), whatever order they were swapped out in."""
    scheduler = make_scheduler(num_gpu=64, num_cpu=64, max_seqs=6, max_model_len=64)
    gs = [create_dummy_prompt(str(i), 8, best_of=2, arrival=float(i))[1] for i in range(3)]
    for g in gs:
        scheduler.add_seq_group(g)
    step(scheduler)
    real_can_append = scheduler.block_manager.can_append_slots
    scheduler.block_manager.can_append_slots = MagicMock(side_effect=lambda g, n: g.request_id == "0")
    _, out = step(scheduler)  # "2" then "1" are preempted (from the back), both by swap
    assert out.num_preempted_by_swap == 2 and [g.request_id for g in out.preempted_seq_groups] == ["2", "1"]
    assert [g.request_id for g in scheduler.swapped] == ["1", "2"]
    scheduler.block_manager.can_append_slots = real_can_append
    scheduler.scheduler_config.max_num_seqs = 4  # room for "0" and one more pair: only the oldest comes back
    _, out = step(scheduler)
    assert [g.request_id for g in groups(out)] == ["0", "1"] and [g.request_id for g in scheduler.swapped] == ["2"]


def test_chunked_prefill_swaps_a_prefill_back_in_whole():
    """vLLM's _schedule_swapped runs without chunking: a swapped prefill waits until its remaining tokens fit."""
    scheduler = make_scheduler(num_gpu=64, num_cpu=64, max_tokens=8, max_seqs=4, max_model_len=64,
                               enable_chunked_prefill=True, preemption_mode="swap")  # fmt: skip
    seq, g = create_dummy_prompt("1", 20, arrival=0.0)
    scheduler.add_seq_group(g)
    step(scheduler)  # 8 of 20 prompt tokens
    scheduler.block_manager.can_append_slots = MagicMock(return_value=False)
    _, out = step(scheduler)
    assert out.num_preempted_by_swap == 1 and seq.status == SequenceStatus.SWAPPED
    del scheduler.block_manager.can_append_slots
    _, decoder = create_dummy_prompt("2", 2, arrival=1.0)
    scheduler.add_seq_group(decoder)
    step(scheduler)  # "2" prefills (2 tokens); "1" needs 12 > 8 - 2 and stays swapped
    assert seq.status == SequenceStatus.SWAPPED
    scheduler.scheduler_config.max_num_batched_tokens = 13
    metas, out = step(scheduler)  # decode of "2" (1) + the whole remaining prefill of "1" (12)
    by_id = {m.request_id: m for m in metas}
    assert by_id["1"].token_chunk_size == 12 and seq.status == SequenceStatus.RUNNING and not seq.is_prefill()


def test_preemption_warns_once_per_group_in_both_modes(caplog):
    """vLLM: 'Sequence group X is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache
    space ... total_num_cumulative_preemption=N'."""
    scheduler = make_scheduler(num_gpu=64, num_cpu=64, max_seqs=6, max_model_len=64)
    single = create_dummy_prompt("0", 8, arrival=0.0)[1]
    pair = create_dummy_prompt("1", 8, best_of=2, arrival=1.0)[1]
    for g in (single, pair):
        scheduler.add_seq_group(g)
    step(scheduler)
    with caplog.at_level("WARNING", logger="paged_serve.core.scheduler"):
        for _ in range(2):
            scheduler.block_manager.can_append_slots = MagicMock(return_value=False)
            step(scheduler)
            del scheduler.block_manager.can_append_slots
            step(scheduler)  # the pair swaps back in
            step(scheduler)  # the single one is prefilled again
    lines = [r.getMessage() for r in caplog.records if "is preempted by" in r.getMessage()]
    assert any("Sequence group 0 is preempted by PreemptionMode.RECOMPUTE mode" in m for m in lines)
    assert any("Sequence group 1 is preempted by PreemptionMode.SWAP mode" in m for m in lines)
    assert len(lines) == 2 and "total_num_cumulative_preemption=" in lines[-1]
    assert scheduler.num_preemptions["recompute"] + scheduler.num_preemptions["swap"] >= 4


def test_scheduler_delay_factor():
    """vLLM's test_scheduler_delay_factor: a new prompt waits delay_factor x the last prompt step's latency."""
    scheduler = make_scheduler(num_gpu=64, max_tokens=100, max_seqs=64, max_model_len=16, delay_factor=0.5)
    scheduler.add_seq_group(create_dummy_prompt("0", BLOCK)[1])
    metas, out = step(scheduler)
    assert out.num_prefill_groups > 0 and metas[0].request_id == "0"
    time.sleep(1)
    scheduler.add_seq_group(create_dummy_prompt("1", BLOCK)[1])
    metas, out = step(scheduler)
    assert out.num_prefill_groups == 0 and metas[0].request_id == "0"  # the new prompt is held back
    time.sleep(0.6)
    metas, out = step(scheduler)
    assert out.num_prefill_groups > 0 and metas[0].request_id == "1"
