"""FullyShardedDataParallel on tcp, shm and gloo: after every step the parameters equal one process trained on the
whole batch and torch's fully_shard (FSDP2) trained alongside in the same ranks, for FULL_SHARD, SHARD_GRAD_OP,
NO_SHARD, HYBRID_SHARD (world 4; against torch's HSDP, fully_shard on a 2x2 mesh, on tcp and shm), bf16 mixed
precision and activation checkpointing inside the units; each rank holds 1/N of the parameter + gradient +
optimizer bytes (tensor sizes summed); a unit's gathered parameters are freed after it (live full-size storages
counted); the prefetches are issued where they should be."""

from __future__ import annotations

import copy
import gc
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist.fsdp import (
    BackwardPrefetch,
    FullyShardedDataParallel,
    MixedPrecision,
    ModuleWrapPolicy,
    ShardingStrategy,
)

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ddp_testutil as dutil  # noqa: E402
import ptdist_testutil as util  # noqa: E402


def _strategies(rank, world, checks):
    for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD):
        dutil.train_fsdp_side_by_side(rank, world, checks, strategy.name, sharding_strategy=strategy)
    dutil.train_fsdp_side_by_side(rank, world, checks, "checkpointed units", lambda: dutil.stack(checkpointed=True))
    dutil.train_fsdp_side_by_side(
        rank, world, checks, "forward prefetch", forward_prefetch=True, backward_prefetch=BackwardPrefetch.BACKWARD_POST
    )


def _bf16_reference(single, xs, ys):
    """The same casts as FSDP's mixed precision: a bf16 copy computes each slice's loss and gradient (its inputs
    cast too), the gradients are averaged in fp32 into the fp32 master."""
    low = copy.deepcopy(single).to(torch.bfloat16)
    grads = [torch.zeros_like(p) for p in single.parameters()]
    for x, y in zip(xs, ys):
        low.zero_grad()
        dutil.mse(low, x.to(torch.bfloat16), y, 0).backward()
        for g, p in zip(grads, low.parameters()):
            g += p.grad.float() / len(xs)
    for p, g in zip(single.parameters(), grads):
        p.grad = g


def _mixed_precision(rank, world, checks):
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16)
    seen = {}
    fsdp = dutil.train_fsdp_side_by_side(
        rank, world, checks, "bf16", mixed_precision=mp, torch_fsdp2=False, reference=_bf16_reference, atol=2e-3
    )
    fsdp[1].register_forward_hook(lambda m, i, o: seen.update({"compute dtype": str(o.dtype)}) and None)
    dutil.mse(fsdp, torch.randn(4, 6), torch.randn(4, 3), rank).backward()
    seen["master dtype"] = sorted({str(p.dtype) for p in fsdp.parameters()})
    seen["grad dtype"] = sorted({str(p.grad.dtype) for p in fsdp.parameters()})
    return seen


def _state_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _memory(rank, world, checks):
    """After backward, before the step: parameters, gradients and AdamW's state held by this rank, FSDP and DDP."""
    out = {}
    for name in ("fsdp", "ddp", "plain"):
        torch.manual_seed(0)
        model = dutil.stack(blocks=4, width=32)
        if name == "fsdp":
            model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}))
        elif name == "ddp":
            model = pt_dist.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        dutil.mse(model, torch.randn(4, 6), torch.randn(4, 3), rank).backward()
        opt.step()  # creates the optimizer state; the gradients are still held
        params = list(model.parameters())
        state = [v for s in opt.state.values() for v in s.values() if v.dim() > 0]
        out[name] = _state_bytes(params) + _state_bytes(p.grad for p in params) + _state_bytes(state)
        if name == "fsdp":
            units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
            out["padding"] = sum(u._handle.padded_numel - u._handle.numel for u in units) * 4 * 4
            out["units"] = len(units)
            symmetric = getattr(pt_dist.group.WORLD, "symmetric", None)  # shm's symmetric heap
            offset = symmetric.offset if symmetric is not None else (lambda t: None)
            out["symmetric"] = [offset(u._handle.flat_param) is not None for u in units]  # shm: shards on the heap
        if name == "ddp":
            out["ddp buckets"] = _state_bytes(b.buffer for b in model.reducer._buckets)
            out[name] += out["ddp buckets"]
    return out


def _live_full_storages(nbytes: int) -> int:
    """Distinct live storages of exactly ``nbytes`` bytes (a unit's gathered parameters), found through the tensors
    the interpreter holds."""
    ptrs = set()
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and not obj.is_meta:
            storage = obj.untyped_storage()
            if storage.nbytes() == nbytes:
                ptrs.add(storage.data_ptr())
    return len(ptrs)


def _count_during_forwards(strategy, prefetch, rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 12), *[dutil.Block(12, 40) for _ in range(4)], torch.nn.Linear(12, 3)
    )
    fsdp = FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}), sharding_strategy=strategy, forward_prefetch=prefetch
    )
    nbytes, counts = fsdp[1]._handle.padded_numel * 4, []
    for k in range(1, 5):
        fsdp[k].module.register_forward_pre_hook(lambda m, i: counts.append(_live_full_storages(nbytes)))
    for _ in range(2):  # the second iteration has the execution order (prefetching needs it)
        counts.clear()
        dutil.mse(fsdp, torch.randn(4, 6), torch.randn(4, 3), rank).backward()
    return counts, _live_full_storages(nbytes)


def _freed(rank, world, checks):
    """Identical blocks: during each block's forward, count the gathered buffers of a block's size alive."""
    return {
        f"{strategy.name}{' prefetch' if prefetch else ''}": _count_during_forwards(strategy, prefetch, rank)
        for strategy, prefetch in (
            (ShardingStrategy.FULL_SHARD, False),
            (ShardingStrategy.FULL_SHARD, True),
            (ShardingStrategy.SHARD_GRAD_OP, False),
        )
    }


def _issue_log(prefetch, rank, root_params=True):
    """The order collectives are issued on the group: all-gathers (AG) and reduce-scatters (RS) by unit, each block's
    compute (run), and where backward starts. Without ``root_params`` the root unit holds no parameters itself."""
    group = pt_dist.group.WORLD
    torch.manual_seed(0)
    model = (
        dutil.stack(blocks=3)
        if root_params
        else torch.nn.Sequential(
            torch.nn.Identity(), *[dutil.Block(6, 20 + 4 * k) for k in range(3)], torch.nn.Identity()
        )
    )
    fsdp = FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}), backward_prefetch=prefetch, forward_prefetch=True
    )
    unit_of = {fsdp[k]._handle.padded_numel: k for k in (1, 2, 3)}  # (the blocks differ in size)
    log, real_ag, real_rs = [], group.all_gather_into_tensor, group.reduce_scatter_tensor

    def ag(out_t, in_t, async_op=False):
        log.append(("AG", unit_of.get(out_t.numel(), "root")))
        return real_ag(out_t, in_t, async_op=async_op)

    def rs(out_t, in_t, op=None, async_op=False):
        log.append(("RS", unit_of.get(in_t.numel(), "root")))
        return real_rs(out_t, in_t, async_op=async_op)

    for k in (1, 2, 3):
        fsdp[k].module.register_forward_pre_hook(lambda m, i, k=k: log.append(("run", k)))
    group.all_gather_into_tensor, group.reduce_scatter_tensor = ag, rs
    try:
        for _ in range(2):
            log.clear()
            loss = dutil.mse(fsdp, torch.randn(4, 6), torch.randn(4, 3 if root_params else 6), rank)
            log.append(("backward", 0))
            loss.backward()
    finally:
        del group.all_gather_into_tensor, group.reduce_scatter_tensor
    return list(log)


def _order(rank, world, checks):
    out = {p.name: _issue_log(p, rank) for p in (BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST)}
    out["no root parameters"] = _issue_log(BackwardPrefetch.BACKWARD_PRE, rank, root_params=False)
    return out


SCENARIOS = {"strategies": _strategies, "bf16": _mixed_precision, "memory": _memory, "freed": _freed, "order": _order}


def _fsdp(rank, world, backend, names):
    segments = set(util.open_segments())  # a pooled rank may still hold an earlier job's; only this job's count
    util.join(rank, world, backend, timeout=60)
    try:
        checks = util.Checks(f"rank {rank}")
        info = {name: SCENARIOS[name](rank, world, checks) for name in names}
    finally:
        util.leave()
    gc.collect()
    # the units are gone with the scenarios: their groups' shared memory too (a unit once kept itself alive through
    # its gradient hook, and the pooled rank held every shm segment it had used)
    info["segments left"] = [s for s in util.open_segments() if s not in segments]
    return checks.fails, checks.count, info


def _run(backend, world, names):
    return run_ranks(_fsdp, world, backend, names, backend=None if backend == "gloo" else "gloo", timeout=240)


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_fsdp_matches_one_process_and_torch_fully_shard(backend):
    results = _run(backend, 2, list(SCENARIOS))
    n_params = len(dutil.stack().state_dict())  # 2 + 3 x 6 + 2 = 22 tensors
    for fails, count, info in results:
        assert not fails, fails[:5]
        # 5 runs of 4 steps against one process and torch's fully_shard, and bf16's 4 steps against its reference
        assert count == 5 * 4 * n_params * 2 + 4 * n_params, count
        assert info["segments left"] == [], info["segments left"]
        assert info["bf16"] == {
            "compute dtype": "torch.bfloat16",
            "master dtype": ["torch.float32"],
            "grad dtype": ["torch.float32"],
        }
        mem = info["memory"]
        # FSDP: 1/N of the plain model's bytes, plus this rank's share of the padding; DDP: all of it + buckets
        assert mem["fsdp"] * 2 <= mem["plain"] + mem["padding"] and mem["fsdp"] * 2 >= mem["plain"], mem
        assert mem["ddp"] == mem["plain"] + mem["ddp buckets"], mem
        assert mem["symmetric"] == [backend == "shm"] * mem["units"], mem
        freed = info["freed"]
        # FULL_SHARD: only the running block's parameters gathered (two with the next one prefetched, but for the
        # last block); SHARD_GRAD_OP keeps every block gathered until backward is over; none are left after it
        assert freed["FULL_SHARD"] == ([1, 1, 1, 1], 0), freed
        assert freed["FULL_SHARD prefetch"] == ([2, 2, 2, 1], 0), freed
        assert freed["SHARD_GRAD_OP"] == ([1, 2, 3, 4], 0), freed
        for name in ("BACKWARD_PRE", "no root parameters"):
            log = info["order"][name]
            forward, pre = log[: log.index(("backward", 0))], log[log.index(("backward", 0)) :]
            for k in (3, 2):  # BACKWARD_PRE: the previous block's all-gather ahead of this block's reduce-scatter
                assert pre.index(("AG", k - 1)) < pre.index(("RS", k)), (name, pre)
            for k in (1, 2):  # forward_prefetch: block k+1 gathered before block k computes
                assert forward.index(("AG", k + 1)) < forward.index(("run", k)), (name, forward)
        post = info["order"]["BACKWARD_POST"]
        post = post[post.index(("backward", 0)) :]
        for k in (3, 2):  # BACKWARD_POST: behind it
            assert post.index(("RS", k)) < post.index(("AG", k - 1)), post


def _hybrid(rank, world, backend):
    segments = set(util.open_segments())
    util.join(rank, world, backend, timeout=60)
    try:
        checks = util.Checks(f"rank {rank}")
        shard = replicate = None
        for ranks in ([0, 1], [2, 3]):  # every rank makes every group, in the same order
            g = pt_dist.new_group(ranks)
            shard = g if rank in ranks else shard
        for ranks in ([0, 2], [1, 3]):
            g = pt_dist.new_group(ranks)
            replicate = g if rank in ranks else replicate
        fsdp = dutil.train_fsdp_side_by_side(
            rank,
            world,
            checks,
            "HYBRID_SHARD",
            torch_fsdp2=backend != "gloo",  # (a mesh over the adapter's groups met torch's stale mesh state)
            mesh_shape=(2, 2),  # torch's HSDP: fully_shard on a (replicate, shard) mesh
            sharding_strategy=ShardingStrategy.HYBRID_SHARD,
            group=(shard, replicate),
        )
        sizes = fsdp[1]._handle.shard_numel, fsdp[1]._handle.numel
        del fsdp, shard, replicate, g
    finally:
        util.leave()
    gc.collect()
    return checks.fails, checks.count, *sizes, [s for s in util.open_segments() if s not in segments]


@pytest.mark.parametrize("backend", ["tcp", "shm", "gloo"])
def test_hybrid_shard_shards_within_pairs_and_replicates_across(backend):
    torch_backend = None if backend == "gloo" else "gloo"  # torch's own group, for its HSDP alongside
    for fails, count, shard, numel, left in run_ranks(_hybrid, 4, backend, backend=torch_backend, timeout=240):
        compared = 1 if backend == "gloo" else 2  # vs one process, and vs torch's HSDP
        assert not fails, fails[:5]
        assert left == [], left  # the four sub-groups' shared memory went with them
        assert count == 4 * len(dutil.stack().state_dict()) * compared
        assert shard == -(-numel // 2)  # half a unit per rank: sharded in pairs, not over all four
