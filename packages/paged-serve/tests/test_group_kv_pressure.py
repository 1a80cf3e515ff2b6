"""Groups of several sequences under KV pressure, as vLLM serves them: the sequences share the prompt's full
blocks, so a group that fits is served (preempted if it must), one that outgrows the pool together is accepted and
ended by the scheduler (vLLM's ``tests/basic_correctness/test_preemption.py::test_swap_infeasible``), and an abort
in any state frees every block. Only a sequence that alone can never fit is refused up front."""

from __future__ import annotations

import pytest
from paged_serve import LLM, SamplingParams
from paged_serve.config import CacheConfig, SchedulerConfig
from paged_serve.core import SequenceStatus
from paged_serve.engine.input_processor import check_fits


def _free(llm):
    bm = llm.llm_engine.scheduler.block_manager
    return bm.get_num_free_gpu_blocks(), bm.get_num_free_cpu_blocks()


@pytest.mark.parametrize("max_tokens", [20, 21])
def test_an_n2_group_that_fits_with_shared_prompt_blocks_is_served(checkpoint, max_tokens):
    """29-token prompt, blocks of 8: with 21 new tokens each sequence reaches 49 tokens (7 blocks); the 3 full
    prompt blocks are shared, so the pair needs 3 + 2 x 4 = 11 of 12 blocks, not 2 x 7 = 14 (20: 48 tokens)."""
    path, _ = checkpoint("llama")
    llm = LLM(path, block_size=8, num_gpu_blocks=12, max_model_len=64)
    prompt = [(7 * i) % 250 + 2 for i in range(29)]
    params = SamplingParams(n=2, max_tokens=max_tokens, temperature=1.0, ignore_eos=True, seed=0)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert [len(c.token_ids) for c in out.outputs] == [max_tokens] * 2
    assert all(c.finish_reason == "length" for c in out.outputs)
    roomy = LLM(path, block_size=8, num_gpu_blocks=64, max_model_len=64)
    want = roomy.generate([prompt], params, use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in want.outputs]  # same seeded tokens
    assert _free(llm)[0] == 12


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=4, use_beam_search=True, temperature=0.0, max_tokens=96, ignore_eos=True),  # vLLM's own
        SamplingParams(n=4, temperature=1.0, max_tokens=96, ignore_eos=True, seed=1),
    ],
    ids=["beam_search", "sampling"],
)
def test_swap_infeasible_group_is_accepted_and_ended_as_vllm_does(checkpoint, params):
    """vLLM's test_swap_infeasible: 4 sequences of up to 115 tokens on 8 blocks of 16 (max_model_len 128). vLLM
    accepts the request; the group is preempted by swap and, when it can no longer come back, ignored: every
    sequence ends with finish_reason "length", cut short, and no block stays held."""
    path, _ = checkpoint("llama")
    llm = LLM(path, block_size=16, num_gpu_blocks=8, max_model_len=128, num_cpu_blocks=64)
    prompt = list(range(2, 22))  # 20 tokens: 20 + 96 - 1 = 115 per sequence
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert len(out.outputs) == 4
    assert all(c.finish_reason == "length" for c in out.outputs)
    assert all(len(c.token_ids) < 96 for c in out.outputs)  # ended by the scheduler, not by max_tokens
    stats = llm.get_stats()
    assert stats.num_preemptions_swap > 0
    assert _free(llm) == (8, 64)
    # the engine is still healthy afterwards
    again = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len(again[0].outputs[0].token_ids) == 8


def test_only_a_sequence_that_alone_can_never_fit_is_refused_up_front():
    """``check_fits``: 100 blocks of 8 less the 1% watermark leave 99; one sequence of 799 tokens needs 100."""
    sched = SchedulerConfig(max_num_batched_tokens=800, max_num_seqs=8, max_model_len=800)
    cache = CacheConfig(block_size=8, num_gpu_blocks=100)
    with pytest.raises(ValueError, match=r"799 tokens needs 100 KV blocks .* the cache has 99"):
        check_fits(SamplingParams(max_tokens=100), 700, sched, cache)
    check_fits(SamplingParams(max_tokens=93), 700, sched, cache)  # 792 tokens: 99 blocks
    check_fits(SamplingParams(n=8, temperature=1.0, max_tokens=93), 700, sched, cache)  # together: scheduler


def _step_until(engine, pred, limit=200):
    for _ in range(limit):
        if pred():
            return
        engine.step()
    raise AssertionError("state never reached")


@pytest.mark.parametrize("state", ["waiting", "running", "swapped"])
def test_abort_an_n2_group_in_every_state_frees_its_blocks(checkpoint, state):
    """n=2 on 7 blocks of 16: abort a group while it waits, runs or is swapped out; its sequences end ABORTED,
    every GPU and CPU block comes back, and the other request still finishes."""
    path, _ = checkpoint("llama")
    llm = LLM(path, block_size=16, num_gpu_blocks=7, max_model_len=112, num_cpu_blocks=16)
    engine, sched = llm.llm_engine, llm.llm_engine.scheduler
    params = SamplingParams(n=2, temperature=1.0, max_tokens=40, ignore_eos=True, seed=0)
    engine.add_request("a", {"prompt_token_ids": list(range(2, 22))}, params)
    engine.add_request("b", {"prompt_token_ids": list(range(30, 50))}, params)
    victim = {"waiting": "b", "running": "a", "swapped": "b"}[state]
    if state != "waiting":
        _step_until(engine, lambda: any(g.request_id == victim for g in getattr(sched, state)))
    group = next(g for g in getattr(sched, state) if g.request_id == victim)
    engine.abort_request(victim)
    assert all(s.status == SequenceStatus.FINISHED_ABORTED for s in group.get_seqs())
    assert not any(g.request_id == victim for q in (sched.waiting, sched.running, sched.swapped) for g in q)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in outs] == [{"a": "b", "b": "a"}[victim]]
    assert all(len(c.token_ids) == 40 for c in outs[0].outputs)
    assert _free(llm) == (7, 16)
