"""torch's test/distributed/fsdp/test_fsdp_state_dict.py (class ``TestFSDPStateDict``), ported to pt_dist's FSDP1,
CPU, world size 2, on tcp and shm; part 1 of 2 (part 2: test_fsdp1_state_dict_upstream2.py). Each case function
mirrors one upstream method and runs its parametrization as loops; checks are collected inside the ranks.

Ported here:
- ``test_state_dict_with_shared_parameters``: a transformer whose output projection shares the embedding's weight
  (``ModuleWrapPolicy`` over the encoder/decoder layers), FULL / SHARDED / LOCAL, loaded into a zeroed model
  (buffers too); beyond upstream, the loaded values are compared with the source's.
- ``test_state_dict_rank0_offload_save_load_flow``: FULL with ``rank0_only`` + ``offload_to_cpu``, loaded on rank
  0 into a plain model, then ``FSDP(..., sync_module_states=True)``: equal across ranks and to the source.
- ``test_basic_save_and_load_state_dict``: non-FSDP root, nested, simple models; ``.half()`` on/off; all three
  types; ``rank0_only`` + ``offload_to_cpu`` for FULL (rank 0 all on CPU, the others ``{}``).
- ``test_buffers_save_and_load_state_dict``: BatchNorm buffers, ``MixedPrecision`` fp16 on/off.
- ``test_save_and_load_after_forward_state_dict``: 6 SGD steps (fp16 loss under MixedPrecision), the state dict
  fp32, zeroed, loaded back to the trained values.
- ``test_world_size_one``: each rank its own singleton group (``pt_dist.new_group(ranks=[r])``), SHARDED saved
  and loaded (beyond upstream: into a zeroed model, values compared).

Adapted: ``use_orig_params=True`` runs where upstream runs it (rank0_offload_save_load_flow, basic_save_and_load,
buffers_save_and_load; FULL and SHARDED, as upstream); ``CPUOffload(offload_params=True)``
and ``offload_to_cpu`` are accepted and change nothing on CPU, where the shards already live. Models are small
stand-ins for common_fsdp's
(``TransformerWithSharedParams``: 2+2 layers of width 16)."""

from __future__ import annotations

import copy
import itertools
import sys
from pathlib import Path

import pt_dist
import torch
from pt_dist.fsdp import (
    CPUOffload,
    FullStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    ModuleWrapPolicy,
    ShardedStateDictConfig,
    StateDictType,
)
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.tensor import DTensor
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402

FULL, SHARDED, LOCAL = StateDictType.FULL_STATE_DICT, StateDictType.SHARDED_STATE_DICT, StateDictType.LOCAL_STATE_DICT
KINDS = (FULL, SHARDED, LOCAL)
FP16 = MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16)
POLICY = ModuleWrapPolicy({nn.TransformerEncoderLayer, nn.TransformerDecoderLayer})


class Shared(nn.Module):
    """common_fsdp's ``TransformerWithSharedParams``, small: ``output_proj`` shares ``embed_tokens``' weight; a
    float and a long buffer, a BatchNorm (its buffers)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed_tokens = nn.Embedding(23, 16)
        self.transformer = nn.Transformer(16, 2, 2, 2, dim_feedforward=8, dropout=0.0)
        self.output_proj = nn.Linear(16, 23)
        self.output_proj.weight = self.embed_tokens.weight
        self.register_buffer("vocab_bias", torch.randn(16))
        self.register_buffer("long_buffer", torch.arange(16))
        self.bn = nn.BatchNorm1d(2)


def mgr(model, kind, rank0_and_offload=False):
    """upstream ``_get_state_dict_mgr``."""
    if kind is FULL:
        config = FullStateDictConfig(rank0_only=rank0_and_offload, offload_to_cpu=rank0_and_offload)
    else:
        config = (ShardedStateDictConfig if kind is SHARDED else LocalStateDictConfig)(offload_to_cpu=rank0_and_offload)
    return FSDP.state_dict_type(model, kind, config)


def broadcast(sd):
    """upstream ``_broadcast_state_dict``: rank 0's state dict on every rank."""
    box = [{k: v.cpu() for k, v in sd.items()} if pt_dist.get_rank() == 0 else None]
    pt_dist.broadcast_object_list(box, src=0)
    return box[0]


def zero(model, buffers=False):
    """upstream ``_zero_model``."""
    with FSDP.summon_full_params(model), torch.no_grad():
        for t in itertools.chain(model.parameters(), model.buffers() if buffers else ()):
            t.zero_()


def states(model, buffers=True):
    """The full parameters (and buffers) under ``summon_full_params``, cloned."""
    with FSDP.summon_full_params(model):
        return [t.detach().clone() for t in itertools.chain(model.parameters(), model.buffers() if buffers else ())]


def same(c, what, a, b, equal=True):
    """upstream ``_compare_models``: as many states; all equal (dtype too), or (before loading) not all."""
    c.true(f"{what}: {len(a)} vs {len(b)} states", len(a) == len(b) and len(a) > 0)
    eq = [x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)]
    c.true(f"{what}: {'equal' if equal else 'differ'} ({eq})", all(eq) if equal else not all(eq))


def validate(c, what, model, sd, rank0_and_offload):
    """upstream ``_validate_state_dict_contents``: rank 0 has all on CPU, the other ranks nothing (FSDP root)."""
    if not rank0_and_offload:
        return
    if c.rank == 0:
        c.true(f"{what}: rank 0 has the state dict, on CPU", sd and all(v.device.type == "cpu" for v in sd.values()))
    elif isinstance(model, FSDP):
        c.true(f"{what}: empty off rank 0: {list(sd)}", sd == {})


def shared_parameters_cases(c, pg):
    """test_state_dict_with_shared_parameters."""
    for kind in KINDS:
        src = FSDP(Shared(0), process_group=pg, auto_wrap_policy=POLICY)
        with mgr(src, kind):
            sd = src.state_dict()
        new = FSDP(Shared(1), process_group=pg, auto_wrap_policy=POLICY)
        zero(new, buffers=True)
        same(c, f"shared {kind.name} before", states(src), states(new), equal=False)
        with mgr(new, kind):
            new.load_state_dict(sd)
        same(c, f"shared {kind.name} loaded", states(src), states(new))
        with FSDP.summon_full_params(new):
            c.true(f"shared {kind.name}: still tied", new.output_proj.weight is new.embed_tokens.weight)


def rank0_offload_flow_cases(c, pg):
    """test_state_dict_rank0_offload_save_load_flow (use_orig_params both ways)."""
    for orig in (False, True):
        _rank0_offload_flow(c, pg, orig)


def _rank0_offload_flow(c, pg, orig):
    src = FSDP(Shared(0), process_group=pg, auto_wrap_policy=POLICY, use_orig_params=orig)
    with FSDP.summon_full_params(src), torch.no_grad():
        for t in itertools.chain(src.parameters(), src.buffers()):
            if torch.count_nonzero(t) == 0:  # every state nonzero, so a zeroed one differs
                t.add_(torch.ones_like(t))
    with mgr(src, FULL, True):
        sd = copy.deepcopy(src.state_dict())
    validate(c, "rank0 flow", src, sd, True)
    new = Shared(1 + c.rank)
    zero(new, buffers=True)
    if c.rank == 0:
        new.load_state_dict(sd, strict=True)

    def across_ranks(what, model, equal):
        mine = [t.detach().clone() for t in itertools.chain(model.parameters(), model.buffers())]
        every = [None, None]
        pt_dist.all_gather_object(every, mine, group=pg)
        eq = [torch.equal(a, b) for a, b in zip(*every)]
        c.true(f"rank0 flow use_orig_params={orig} {what}: {eq}",
               len(eq) == len(mine) and (all(eq) if equal else not any(eq)))

    across_ranks("loaded on rank 0 only", new, equal=False)
    fsdp = FSDP(new, process_group=pg, device_id=torch.device("cpu"), auto_wrap_policy=POLICY, sync_module_states=True)
    with FSDP.summon_full_params(fsdp):
        across_ranks("after sync_module_states", fsdp, equal=True)
    same(c, f"rank0 flow use_orig_params={orig}: the checkpoint's values", states(src, buffers=False),
         states(fsdp, buffers=False))


def simple(pg, **kw):
    return FSDP(nn.Linear(10, 10, bias=False), process_group=pg, **kw)


def nested(pg, **kw):
    return FSDP(nn.Sequential(FSDP(nn.Linear(10, 10, bias=False), process_group=pg, **kw),
                              nn.Linear(10, 10, bias=False)), process_group=pg, **kw)


class Container(nn.Module):
    """upstream ``_get_non_fsdp_root_module``: a plain root over a plain Linear and two nested FSDP models."""

    def __init__(self, pg, **kw):
        super().__init__()
        self.non_fsdp_lin = nn.Linear(10, 10, bias=False)
        self.fsdp_1, self.fsdp_2 = nested(pg, **kw), nested(pg, **kw)

    def forward(self, x):
        return self.fsdp_2(self.fsdp_1(self.non_fsdp_lin(x)))


def _fwd_bwd(model, fp16):
    x = torch.randn(3, 10)
    model(x.half() if fp16 else x).sum().backward()


def basic_save_load_cases(c, pg):
    """test_basic_save_and_load_state_dict (cpu_offload both ways, use_orig_params both ways)."""
    for make, kind, fp16, rank0, params_off, orig in itertools.product(
            (Container, nested, simple), KINDS, (False, True), (False, True), (False, True), (False, True)):
        if rank0 and kind is not FULL or orig and kind is LOCAL:
            continue  # as upstream: rank0_only is FULL's; use_orig_params with the unflattened kinds only
        off = CPUOffload(offload_params=params_off)
        what = f"basic {make.__name__} {kind.name} fp16={fp16} rank0={rank0} cpu_offload={params_off} orig={orig}"
        model = make(pg, cpu_offload=off, use_orig_params=orig)
        if fp16:
            model.half()
        _fwd_bwd(model, fp16)  # gradients present when saving
        with mgr(model, kind, rank0):
            sd = (model.half() if fp16 else model).state_dict()
        validate(c, what, model, sd, rank0)
        if fp16:
            c.true(f"{what}: fp16 entries", all(v.dtype == torch.float16 for v in sd.values()))
        new = make(pg, cpu_offload=off, use_orig_params=orig)
        if fp16:
            new.half()
        _fwd_bwd(new, fp16)
        zero(new, buffers=True)
        same(c, f"{what} before", states(model), states(new), equal=False)
        if rank0:
            sd = broadcast(sd)
        with FSDP.state_dict_type(new, kind):
            new.load_state_dict(sd, strict=True)
        after = states(new)
        same(c, f"{what} loaded", states(model), after)
        if fp16:
            c.true(f"{what}: loaded model fp16", all(t.dtype == torch.float16 for t in after))


def multibuffer(pg, mp, orig=False):
    """upstream ``_get_multibuffer_nested_model``: FSDP(Linear) with ``mp``, FSDP(BatchNorm1d) in fp32, a Linear."""
    bn_mp = MixedPrecision(torch.float32, torch.float32, torch.float32) if mp else None
    bn = nn.BatchNorm1d(10)
    with torch.no_grad():  # (beyond upstream: running stats that zeroing changes everywhere)
        bn.running_mean.uniform_(-1, 1)
        bn.num_batches_tracked.fill_(5)
    kw = {"process_group": pg, "use_orig_params": orig}
    return FSDP(nn.Sequential(FSDP(nn.Linear(10, 10, bias=False), mixed_precision=mp, **kw),
                              FSDP(bn, mixed_precision=bn_mp, **kw), nn.Linear(10, 10, bias=False)), **kw)


def buffers_cases(c, pg):
    """test_buffers_save_and_load_state_dict (cpu_offload=CPUOffload(False), use_orig_params both ways)."""
    for kind, mp, rank0, orig in itertools.product(KINDS, (None, FP16), (False, True), (False, True)):
        if rank0 and kind is not FULL or orig and kind is LOCAL:
            continue
        what = f"buffers {kind.name} mp={mp is not None} rank0={rank0} orig={orig}"
        model = multibuffer(pg, mp, orig)
        with mgr(model, kind, rank0):
            sd = model.state_dict()
        validate(c, what, model, sd, rank0)
        new = multibuffer(pg, mp, orig)
        zero(new, buffers=True)
        same(c, f"{what} before", states(model), states(new), equal=False)
        if rank0:
            sd = broadcast(sd)
        with FSDP.state_dict_type(new, kind):
            new.load_state_dict(sd, strict=True)
        same(c, f"{what} loaded", states(model), states(new))


def _clone(v):
    if isinstance(v, DTensor):
        return DTensor.from_local(v.to_local().clone(), v.device_mesh, v.placements, shape=v.shape, stride=v.stride())
    return v.clone()


def after_forward_cases(c, pg):
    """test_save_and_load_after_forward_state_dict."""
    for kind, mp, rank0 in itertools.product(KINDS, (None, FP16), (False, True)):
        if rank0 and kind is not FULL:
            continue
        what = f"after forward {kind.name} mp={mp is not None} rank0={rank0}"
        model = nested(pg, mixed_precision=mp)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        initial = states(model)
        for _ in range(6):
            loss = model(*torch.randn(1, 10)).sum()
            c.true(f"{what}: loss dtype {loss.dtype}", loss.dtype == (torch.float32 if mp is None else torch.float16))
            loss.backward()
            opt.step()
        trained = states(model)
        same(c, f"{what}: trained", initial, trained, equal=False)
        with mgr(model, kind, rank0):
            sd = {k: _clone(v) for k, v in model.state_dict().items()}
        validate(c, what, model, sd, rank0)
        zero(model)
        c.true(f"{what}: fp32 state dict", all(v.dtype == torch.float32 for v in sd.values()))
        if rank0:
            sd = broadcast(sd)
        with FSDP.state_dict_type(model, kind):
            model.load_state_dict(sd, strict=True)
        same(c, f"{what}: loaded", states(model), trained)


def world_size_one_cases(c, pg):
    """test_world_size_one: each rank FSDP over its own singleton group."""
    mine = [pt_dist.new_group(ranks=[r]) for r in range(c.world_size)][c.rank]
    model = FSDP(Shared(0), process_group=mine, auto_wrap_policy=POLICY)
    with FSDP.state_dict_type(model, SHARDED):
        sd = model.state_dict()
        model.load_state_dict(sd)
        c.true("world size one: DTensors over one rank",
               all(v.device_mesh.size() == 1 for v in sd.values() if isinstance(v, DTensor)))
    new = FSDP(Shared(1), process_group=mine, auto_wrap_policy=POLICY)
    zero(new, buffers=True)
    with FSDP.state_dict_type(new, SHARDED):
        new.load_state_dict(sd)
    same(c, "world size one: loaded", states(model), states(new))
    pt_dist.barrier()


CASES = (shared_parameters_cases, rank0_offload_flow_cases, basic_save_load_cases, buffers_cases,
         after_forward_cases, world_size_one_cases)


@upstream_cases.parametrize(CASES, expect=6)
def test_fsdp1_state_dict_upstream(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180, seed=0)
