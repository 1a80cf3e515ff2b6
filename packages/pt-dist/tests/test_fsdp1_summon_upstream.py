"""torch's test/distributed/fsdp/test_fsdp_summon_full_params.py (TestSummonFullParams, world size 2, and
TestSummonFullParamsNoShard, world size 1; since folded into test_fsdp_unshard_params.py, whose error types these
follow), ported to pt_dist's FSDP1 on CPU, tcp and shm.

- ``test_summon_full_param_writeback``: a value written into a unit's local shard, zeroed through the flat
  parameter inside ``summon_full_params``, persists with ``writeback`` (or unsharded, world size 1) and not
  without; mixed precision and ``CPUOffload`` on and off (world size 1: off, as upstream).
- ``shard_value``, ``recursive``: the flat parameter is the rank's chunk outside and the whole unpadded
  parameter inside, for the units ``recurse`` and the summoned module select.
- ``from_backward``: refused from a backward hook (from forward: ``summon_cases`` in test_fsdp1_upstream.py).
- ``respects_reshard_after_forward``, ``reshard_outside_forward_backward_iteration``: the root keeps its gathered
  buffer after forward, and still does after a summon; after backward none does (upstream's
  ``_full_param_padded.storage().size()`` is the handle's gathered buffer here).
- ``summon_single_param``, ``equivalence`` (``CPUOffload(offload_params=True)``), ``from_non_fsdp``,
  ``params_are_unflattenned``, ``params_count_and_value``, ``named_parameters_buffers``.

Left out: upstream's ``use_orig_params=True`` halves and ``test_with_grads_core`` / ``test_with_grads_none_grads``
(``with_grads`` needs ``use_orig_params=True``, which pt_dist's FSDP1 refuses; ``with_grads`` without it is a
NotImplementedError, checked in ``summon_cases``), and ``test_raises_rank0_with_writeback`` (in ``summon_cases``).
``offload_to_cpu`` changes nothing on CPU, where the parameters already are. Models are common_fsdp's
``DeterministicModel`` and a small ``NestedWrappedModule``.
"""

from __future__ import annotations

import copy
import itertools
import math
import sys
from pathlib import Path

import pt_dist
import torch
from pt_dist.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.fsdp.wrap import enable_wrap, wrap
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402

MPS = (MixedPrecision(param_dtype=torch.float16), None)
RANK0_OFFLOAD_MP = list(itertools.product((True, False), (True, False), MPS))


def _flat(unit):
    return unit._handle.flat_param


def _gathered(unit) -> int:
    """Elements in the unit's gathered buffer (upstream's ``flat_param._full_param_padded.storage().size()``)."""
    handle = unit._handle
    return handle._full.untyped_storage().nbytes() // handle.param_dtype.itemsize


class DeterministicModel(nn.Module):
    """common_fsdp's: an inner Linear(2, 2) (its own unit with ``wrap_fsdp``) and an outer one."""

    def __init__(self, wrap_fsdp, pg=None, cpu_offload=None):
        super().__init__()
        torch.manual_seed(0)
        self.inner = nn.Linear(2, 2)
        if wrap_fsdp:
            self.inner = FSDP(self.inner, process_group=pg, cpu_offload=cpu_offload)
        self.outer = nn.Linear(2, 2)

    def forward(self, x):
        return self.outer(self.inner(x))


def _nested(pg, fsdp: bool):
    """common_fsdp's ``NestedWrappedModule`` (deterministic): Linear(8,4), [wrapped Linear(4,16), Linear(16,16)],
    wrapped Linear(16,4), Linear(4,8); with ``fsdp`` the two inner units and the root."""
    torch.manual_seed(0)
    with enable_wrap(wrapper_cls=FSDP, process_group=pg):
        maybe = wrap if fsdp else (lambda m: m)
        module = nn.Sequential(nn.Linear(8, 4), nn.Sequential(maybe(nn.Linear(4, 16)), nn.Linear(16, 16)),
                               maybe(nn.Linear(16, 4)), nn.Linear(4, 8))
    return FSDP(module, process_group=pg) if fsdp else module


def _two_units(pg, out=3, **kw):
    """``FSDP(Sequential(FSDP(Linear(5, 5)), Linear(5, out)))``, no biases."""
    return FSDP(nn.Sequential(FSDP(nn.Linear(5, 5, bias=False), process_group=pg, **kw),
                              nn.Linear(5, out, bias=False)), process_group=pg, **kw)


OFFLOADS = (CPUOffload(offload_params=False), CPUOffload(offload_params=True))


def writeback_cases(c, pg, offloads=OFFLOADS):
    """upstream ``_run_test_summon_full_param_writeback``."""
    for writeback, modify_outer, mp, offload, orig in itertools.product((True, False), (True, False), MPS, offloads,
                                                                        (True, False)):
        what = (f"writeback={writeback} outer={modify_outer} mp={mp is not None} offload={offload.offload_params} "
                f"use_orig_params={orig}")
        with enable_wrap(wrapper_cls=FSDP, process_group=pg, mixed_precision=mp, cpu_offload=offload,
                         use_orig_params=orig):
            model = wrap(nn.Sequential(wrap(nn.Linear(5, 5, bias=False)), nn.Linear(5, 3, bias=False)))
        p = _flat(model if modify_outer else model.module[0])
        with torch.no_grad():
            p[0] = c.rank + 2  # the local shard's first element
        with FSDP.summon_full_params(model, writeback=writeback), torch.no_grad():
            p.copy_(torch.zeros_like(p))
        want = 0.0 if writeback or c.world_size == 1 else float(c.rank + 2)
        c.true(f"{what}: first element {p[0].item()}, want {want}", p[0].item() == want)


def shard_value_cases(c, pg):
    for mp in MPS:
        raw = nn.Linear(10, 11)
        size = sum(q.numel() for q in raw.parameters())
        model = FSDP(raw, process_group=pg, mixed_precision=mp)
        c.true("one flat parameter of the padded shard's size",
               [q.numel() for q in model.parameters()] == [math.ceil(size / c.world_size)])
        mine = next(model.parameters()).detach().clone()
        with FSDP.summon_full_params(model):
            params = list(model.parameters())
            c.true(f"the full size inside: {[q.numel() for q in params]}", sum(q.numel() for q in params) == size)
            chunk = torch.cat([q.detach().reshape(-1) for q in params]).chunk(c.world_size)[c.rank]
            c.equal(f"the shard is the rank's chunk (mp={mp is not None})", mine[:chunk.numel()], chunk, 0, 0)


def recursive_cases(c, pg):
    inner_numel, outer_numel = 25, 15
    for recurse, summon_outer, mp in itertools.product((True, False), (True, False), MPS):
        what = f"recurse={recurse} outer={summon_outer} mp={mp is not None}"
        model = _two_units(pg, mixed_precision=mp)
        outer, inner = _flat(model), _flat(model.module[0])
        shard_inner, shard_outer = math.ceil(inner_numel / c.world_size), math.ceil(outer_numel / c.world_size)
        c.true(f"{what}: shards", (outer.numel(), inner.numel()) == (shard_outer, shard_inner))
        target = model if summon_outer else model.module[0]
        want = (outer_numel if summon_outer else shard_outer,
                inner_numel if recurse or not summon_outer else shard_inner)
        with FSDP.summon_full_params(target, recurse=recurse):
            c.true(f"{what}: inside {(outer.numel(), inner.numel())}, want {want}",
                   (outer.numel(), inner.numel()) == want)
        c.true(f"{what}: sharded after", (outer.numel(), inner.numel()) == (shard_outer, shard_inner))


def from_backward_cases(c, pg):
    model = FSDP(nn.Linear(2, 1), process_group=pg)
    out = model(torch.ones(2))

    def bad_backward_hook(grad):
        with FSDP.summon_full_params(model):
            pass

    c.true("the output requires grad", out.requires_grad)
    out.register_hook(bad_backward_hook)
    c.raises("summon from backward", AssertionError, out.backward, "during forward/backward")


def reshard_after_forward_cases(c, pg):
    """upstream ``_test_summon_full_params_respects_reshard_after_forward``."""
    for mp, orig in itertools.product(MPS, (False, True)):
        what = f"mp={mp is not None} use_orig_params={orig}"
        model = _two_units(pg, mixed_precision=mp, use_orig_params=orig)
        full = _flat(model).numel() * c.world_size
        model(torch.zeros(5))
        kept = (_gathered(model), _gathered(model.module[0]))
        c.true(f"{what}: the root keeps its buffer after forward: {kept}", kept == (full, 0))
        with FSDP.summon_full_params(model):
            pass
        after = (_gathered(model), _gathered(model.module[0]))
        c.true(f"{what}: and after a summon: {after}", after == (full, 0))


def reshard_outside_cases(c, pg):
    """upstream ``test_reshard_outside_forward_backward_iteration``."""
    for rank0_only, offload, mp in RANK0_OFFLOAD_MP:
        what = f"rank0_only={rank0_only} offload={offload} mp={mp is not None}"
        model = _two_units(pg, out=1, mixed_precision=mp)
        full = _flat(model).numel() * c.world_size

        def sizes(model=model):
            return _gathered(model), _gathered(model.module[0])

        out = model(torch.zeros(5))
        c.true(f"{what}: after forward {sizes()}", sizes() == (full, 0))
        out.backward()
        c.true(f"{what}: after backward {sizes()}", sizes() == (0, 0))
        out = model(torch.zeros(5))
        with FSDP.summon_full_params(model, rank0_only=rank0_only, writeback=not rank0_only, offload_to_cpu=offload):
            pass
        c.true(f"{what}: summoned between forward and backward {sizes()}", sizes() == (full, 0))
        out.backward()
        with FSDP.summon_full_params(model, rank0_only=rank0_only, writeback=not rank0_only, offload_to_cpu=offload):
            pass
        c.true(f"{what}: summoned after backward {sizes()}", sizes() == (0, 0))


def single_param_cases(c, pg):
    model = FSDP(nn.Linear(1, 1, bias=False), process_group=pg)
    p = _flat(model)
    c.true("one element", p.numel() == 1)
    with torch.no_grad():
        p[0] = c.rank + 2
    with FSDP.summon_full_params(model, writeback=True):
        c.true("one element inside", p.numel() == 1)
        with torch.no_grad():
            p.copy_(torch.zeros_like(p))
    # rank 1 holds only padding: only rank 0 sees the write
    c.true(f"rank {c.rank} holds {p[0].item()}", p[0].item() == (0.0 if c.rank == 0 else c.rank + 2))


def equivalence_cases(c, pg):
    offload = CPUOffload(offload_params=True)
    for rank0_only, offload_to_cpu in itertools.product((True, False), (True, False)):
        what = f"rank0_only={rank0_only} offload_to_cpu={offload_to_cpu}"
        model = FSDP(DeterministicModel(True, pg, cpu_offload=offload), process_group=pg, cpu_offload=offload)
        local = DeterministicModel(False)
        want = ([p.detach().clone() for p in model.parameters()] if rank0_only and c.rank != 0
                else [p.detach().clone() for p in local.parameters()])
        writeback = not rank0_only
        with FSDP.summon_full_params(model, recurse=True, rank0_only=rank0_only, writeback=writeback,
                                     offload_to_cpu=offload_to_cpu):
            if writeback:
                with torch.no_grad():
                    for p in itertools.chain(model.parameters(), want):
                        p.add_(1)
            got = [p.detach().clone() for p in model.parameters()]
        c.true(f"{what}: {len(got)} vs {len(want)}", len(got) == len(want))
        for a, b in zip(got, want):
            c.equal(what, a, b, 0, 0)
        c.true(f"{what}: on the CPU after", all(p.device.type == "cpu" for p in model.parameters()))


def non_fsdp_root_cases(c, pg):
    class Container(nn.Module):
        def __init__(self, a, b, d):
            super().__init__()
            self.fsdp_1, self.fsdp_2, self.fsdp_3 = a, b, d

    model = Container(FSDP(DeterministicModel(True, pg), process_group=pg),
                      FSDP(DeterministicModel(True, pg), process_group=pg), DeterministicModel(False))
    plain = Container(DeterministicModel(False), DeterministicModel(False), DeterministicModel(False))
    with FSDP.summon_full_params(model):
        got = [p.detach().clone() for p in model.parameters()]
    want = list(plain.parameters())
    c.true(f"{len(got)} parameters, want {len(want)}", len(got) == len(want))
    for a, b in zip(got, want):
        c.equal("from a non-FSDP root", a, b, 0, 0)


def unflattened_cases(c, pg):
    """upstream ``test_params_are_unflattenned``."""
    for rank0_only, offload, mp in RANK0_OFFLOAD_MP:
        what = f"rank0_only={rank0_only} offload={offload} mp={mp is not None}"
        plain = nn.Linear(10, 12, bias=False)
        model = FSDP(copy.deepcopy(plain), process_group=pg, mixed_precision=mp)
        flat = _flat(model)
        c.true(f"{what}: half on each rank", flat.numel() == 120 / c.world_size)
        shard = flat.detach().clone()
        with FSDP.summon_full_params(model, rank0_only=rank0_only, writeback=not rank0_only, offload_to_cpu=offload):
            if c.rank == 0 or not rank0_only:
                c.true(f"{what}: the original shape", model.weight.shape == plain.weight.shape)
                c.true(f"{what}: on the CPU", model.weight.device.type == "cpu")
            else:
                c.true(f"{what}: other ranks keep the flat shard", _flat(model) is flat and flat.numel() == 60)
                c.equal(f"{what}: its values", flat, shard, 0, 0)
        names = [n for n, _ in model.named_parameters()]
        c.true(f"{what}: flat again after: {names}", names == ["_fsdp_wrapped_module._flat_param"])


def count_and_value_cases(c, pg):
    """upstream ``test_params_count_and_value``."""
    for rank0_only, _offload, _mp in RANK0_OFFLOAD_MP:
        plain, model = _nested(pg, False), _nested(pg, True)
        want = ([p.detach().clone() for p in plain.parameters()] if not rank0_only or c.rank == 0
                else [p.detach().clone() for p in model.parameters()])
        with FSDP.summon_full_params(model, rank0_only=rank0_only, writeback=not rank0_only):
            got = list(model.parameters())
            c.true(f"rank0_only={rank0_only}: {len(got)} parameters, want {len(want)}", len(got) == len(want))
            for a, b in zip(got, want):
                c.equal(f"rank0_only={rank0_only}", a, b, 0, 0)


def named_cases(c, pg):
    """upstream ``test_named_parameters_buffers``: a top-level unit's names are the plain model's."""
    for prefix, recurse in itertools.product(("", "test_prefix"), (False, True)):
        plain = _nested(pg, False)
        plain.register_buffer("buffer", torch.ones(1))
        model = FSDP(_nested(pg, False), process_group=pg)
        model.register_buffer("buffer", torch.ones(1))
        with FSDP.summon_full_params(model):
            for call in ("named_parameters", "named_buffers"):
                got = list(getattr(model, call)(prefix=prefix, recurse=recurse))
                want = list(getattr(plain, call)(prefix=prefix, recurse=recurse))
                what = f"{call}(prefix={prefix!r}, recurse={recurse})"
                c.true(f"{what}: {[n for n, _ in got]} vs {[n for n, _ in want]}",
                       [n for n, _ in got] == [n for n, _ in want])
                for (n, a), (_, b) in zip(got, want):
                    c.equal(f"{what} {n}", a, b, 0, 0)


class SharedParams(nn.Module):
    """A small stand-in for common_fsdp's ``TransformerWithSharedParams``: an embedding tied to the output
    projection, a body (its own unit when wrapped), deterministic."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.body(self.embed(x)))


def _shared_fsdp(pg, **kw):
    model = SharedParams()
    model.body = FSDP(model.body, process_group=pg, **kw)
    return FSDP(model, process_group=pg, **kw)


STRATEGIES = (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD)


def _check_grads(c, what, ddp, fsdp, old, writeback, offload, persists, factor=2):
    """upstream ``_check_grads``."""
    with FSDP.summon_full_params(fsdp, writeback=writeback, offload_to_cpu=offload, with_grads=True):
        for (n1, p1), (n2, p2) in zip(ddp.module.named_parameters(), fsdp.named_parameters(), strict=True):
            c.true(f"{what}: names {n1} {n2}", n1 == n2)
            c.equal(f"{what}: {n1} grad", p2.grad, p1.grad, 1e-5, 1e-6)
            c.true(f"{what}: {n1} grad not all zeros", int(torch.count_nonzero(p2.grad)) > 0)
            p2.grad *= factor
    new = [p.grad for p in fsdp.parameters() if p.grad is not None]
    c.true(f"{what}: as many gradients after ({len(new)}) as before ({len(old)})", len(new) == len(old))
    for a, b in zip(old, new):
        c.equal(f"{what}: after", b, a * factor if persists else a, 1e-5, 1e-6)
    if persists:
        for p in ddp.parameters():
            p.grad *= factor


def with_grads_core_cases(c, pg):
    """upstream ``_test_with_grads_core``: inside ``summon_full_params(with_grads=True)`` the gradients equal
    DDP's; doubled inside, they stay doubled with ``writeback`` (or NO_SHARD); after backward and between forward
    and backward; ``offload_to_cpu`` with ``with_grads`` is a NotImplementedError, as upstream."""
    for writeback, offload, strategy in itertools.product((False, True), (False, True), STRATEGIES):
        what = f"writeback={writeback} offload={offload} {strategy.name}"
        ddp = pt_dist.DistributedDataParallel(SharedParams(), process_group=pg)
        fsdp = _shared_fsdp(pg, use_orig_params=True, sharding_strategy=strategy)
        with FSDP.summon_full_params(fsdp):
            c.true(f"{what}: the same start", all(torch.equal(a, b) for a, b in
                                                   zip(ddp.module.parameters(), fsdp.parameters())))
        args = (c, what, ddp, fsdp)
        kw = dict(writeback=writeback, offload=offload, persists=writeback or strategy is ShardingStrategy.NO_SHARD)
        for between in (False, True):
            x = torch.randint(0, 10, (3, 2), generator=torch.Generator().manual_seed(c.rank + 10 * between))
            ddp_out, fsdp_out = ddp(x), fsdp(x)
            if not between:  # after backward; else the gradients of the last backward, between forward and backward
                ddp_out.sum().backward()
                fsdp_out.sum().backward()
            old = [p.grad.clone() for p in fsdp.parameters() if p.grad is not None]
            if offload:
                c.raises(f"{what}: offload", NotImplementedError,
                         lambda args=args, old=old, kw=kw: _check_grads(*args, old, **kw), "is not supported")
            else:
                _check_grads(*args, old, **kw)
            if between:
                ddp_out.sum().backward()
                fsdp_out.sum().backward()


def with_grads_none_grads_cases(c, pg):
    """upstream ``_test_with_grads_none_grads``: no backward yet, every original's gradient is None inside."""
    for strategy in STRATEGIES:
        fsdp = _shared_fsdp(pg, use_orig_params=True, sharding_strategy=strategy)
        c.true(f"{strategy.name}: no flat gradient", all(u._flat_param.grad is None for u in FSDP.fsdp_modules(fsdp)))
        with FSDP.summon_full_params(fsdp, with_grads=True):
            c.true(f"{strategy.name}: None inside", all(p.grad is None for p in fsdp.parameters()))


CASES = (writeback_cases, shard_value_cases, recursive_cases, from_backward_cases, reshard_after_forward_cases,
         reshard_outside_cases, single_param_cases, equivalence_cases, non_fsdp_root_cases, unflattened_cases,
         count_and_value_cases, named_cases, with_grads_core_cases, with_grads_none_grads_cases)


def no_shard_writeback_cases(c, pg):
    """TestSummonFullParamsNoShard: world size 1, CPUOffload off (upstream: not supported unsharded)."""
    writeback_cases(c, pg, offloads=OFFLOADS[:1])


@upstream_cases.parametrize(CASES, expect=14)
def test_upstream_fsdp1_summon_full_params_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180)


@upstream_cases.parametrize((no_shard_writeback_cases,), expect=1)
def test_upstream_fsdp1_summon_full_params_no_shard_cases(backend, case, request):
    upstream_cases.check(request, world=1, timeout=120)
