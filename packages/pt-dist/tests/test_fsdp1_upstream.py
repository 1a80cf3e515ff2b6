"""More of torch's FSDP1 tests, ported to pt_dist (issue 34, defect 5): test/distributed/fsdp/
test_fsdp_grad_acc.py (``no_sync`` accumulation against synced steps; no communication inside; its
``test_grad_acc`` interleavings against one backward over the concatenated batches, every prefetch and strategy),
test_fsdp_checkpoint.py (reentrant activation checkpointing around FSDP units), test_fsdp_summon_full_params.py
(full values, writeback on and off, ``rank0_only``, ``recurse=False``, refused inside forward and when nested,
the unsupported argument pairs), test_wrap.py (``enable_wrap``/``wrap`` as its ``TestFSDPWrap``/``TestAutoWrap``
use them) and test_fsdp_state_dict.py (a unit inside a plain parent such as ``checkpoint_wrapper``: its entries
under the parent's prefix; ``state_dict_type`` refusing a config of the wrong kind). Adapted: CPU, checks
collected inside the ranks."""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
from pathlib import Path

import pt_dist
import torch
from pt_dist.fsdp import FullStateDictConfig, LocalStateDictConfig, StateDictType
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.fsdp.wrap import enable_wrap, wrap
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Sequential(nn.Linear(7, 5), nn.Tanh()), nn.Linear(5, 3))


def _wrapped(pg):
    model = _net()
    model[2] = FSDP(model[2], process_group=pg)
    return FSDP(model, process_group=pg)


def _batch(rank, i):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * rank + i))


def grad_acc_cases(c, pg):
    """test_fsdp_grad_acc.py: gradients accumulated over micro-batches inside no_sync, then one synced backward,
    equal the gradients of synced backward passes on the same micro-batches; nothing is reduced inside."""
    real = pg.reduce_scatter_tensor
    for configs in ((True, True, False), (True, False, True, False)):  # no_sync? per micro-batch; the last synced
        acc, ref = _wrapped(pg), _wrapped(pg)
        calls = []
        pg.reduce_scatter_tensor = lambda *a, calls=calls, **k: (calls.append(1), real(*a, **k))[1]
        try:
            for i, skip in enumerate(configs):
                ctx = acc.no_sync() if skip else torch.enable_grad()
                before = len(calls)
                with ctx:
                    acc(_batch(c.rank, i)).sum().backward()
                c.true(f"no_sync={skip}: reduce-scatters {len(calls) - before}", (len(calls) > before) != skip)
        finally:
            pg.reduce_scatter_tensor = real
        for i in range(len(configs)):
            ref(_batch(c.rank, i)).sum().backward()
        for (n, a), b in zip(acc.named_parameters(), ref.parameters()):
            c.equal(f"accumulated gradient {n} {configs}", a.grad, b.grad, rtol=1e-5, atol=1e-6)
    inner = _wrapped(pg)
    inner(_batch(c.rank, 0))
    c.raises("no_sync on an inner unit", RuntimeError, lambda: inner[2].no_sync().__enter__(), "root FSDP")


def grad_acc_interleaved_cases(c, pg):
    """test_fsdp_grad_acc.py's ``test_grad_acc`` itself: 3 + 3 + 3 micro-batches, ``no_sync`` on, off, on (and
    off, on, off), the last always synced, give the gradients of one backward over their concatenation, for every
    backward_prefetch (None, PRE, POST) and sharding strategy (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD); then SGD
    with momentum steps. And ``test_grad_acc_cpu_offload``: 3 micro-batches inside ``no_sync`` but the last, under
    ``CPUOffload(offload_params=True)``. Each with ``use_orig_params`` off and on, as upstream."""
    from pt_dist.fsdp import BackwardPrefetch, CPUOffload, ShardingStrategy

    for pattern, offload in (((True, False, True), False), ((False, True, False), False), ((True,), True)):
        batches = [_batch(c.rank, i) for i in range(3 * len(pattern))]
        for prefetch in (None, BackwardPrefetch.BACKWARD_PRE, BackwardPrefetch.BACKWARD_POST):
            for strategy, orig in itertools.product(
                    (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD),
                    (False, True)):
                model = _net()
                kw = {"process_group": pg, "backward_prefetch": prefetch, "sharding_strategy": strategy,
                      "cpu_offload": CPUOffload(offload_params=offload), "use_orig_params": orig}
                model[2] = FSDP(model[2], **kw)
                model = FSDP(model, **kw)
                model(torch.cat(batches)).sum().backward()
                ref = [p.grad.clone() for p in model.parameters() if p.grad is not None]  # (as upstream)
                model.zero_grad()
                for i, x in enumerate(batches):
                    skip = pattern[i // 3] and i < len(batches) - 1
                    with model.no_sync() if skip else contextlib.nullcontext():
                        model(x).sum().backward()
                what = f"{pattern} {prefetch} {strategy.name} offload={offload} use_orig_params={orig}"
                acc = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
                c.true(f"{what}: {len(acc)} gradients, {len(ref)} before", len(acc) == len(ref) > 0)
                for (n, g), r in zip(acc, ref):
                    c.equal(f"accumulated {n} {what}", g, r, rtol=1e-5, atol=1e-5)
                torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9).step()


def summon_cases(c, pg):
    """test_fsdp_summon_full_params.py."""
    local, model = _net(), _wrapped(pg)
    with FSDP.summon_full_params(model):
        names = [n for n, _ in model.named_parameters()]
        c.true(f"the originals are the parameters inside: {names}", all("flat_param" not in n for n in names)
               and len(names) == len(list(local.parameters())))
        for (n, p), q in zip(model.named_parameters(), local.parameters()):
            c.equal(f"full value {n}", p, q, rtol=0, atol=0)
    c.true("the flat parameters are back after", all("flat_param" in n for n, _ in model.named_parameters()))
    x = _batch(c.rank, 0)
    with FSDP.summon_full_params(model, writeback=False):
        for p in model.parameters():
            p.data.zero_()
    c.equal("writeback=False discards the change", model(x), local(x), rtol=1e-6, atol=1e-6)
    with FSDP.summon_full_params(model, writeback=True):
        model.module[0].weight.data.fill_(0.5)
    with torch.no_grad():
        local[0].weight.fill_(0.5)
    c.equal("writeback=True keeps the change", model(x), local(x), rtol=1e-6, atol=1e-6)
    with FSDP.summon_full_params(model, rank0_only=True, writeback=False):
        full = [n for n, _ in model.named_parameters() if "flat_param" not in n]
        c.true(f"rank0_only: full parameters on rank 0 only ({full})", bool(full) == (c.rank == 0))
    with FSDP.summon_full_params(model, recurse=False):
        names = [n for n, _ in model.named_parameters()]
        c.true(f"recurse=False: the inner unit stays flat ({names})", any("flat_param" in n for n in names)
               and any(n.endswith("0.weight") for n in names))
    c.raises("writeback with rank0_only", NotImplementedError,
            lambda: FSDP.summon_full_params(model, writeback=True, rank0_only=True).__enter__(), "rank0_only")
    c.raises("with_grads without use_orig_params", NotImplementedError,
            lambda: FSDP.summon_full_params(model, with_grads=True).__enter__(), "with_grads")
    with FSDP.summon_full_params(model):
        c.raises("nested", AssertionError, lambda: FSDP.summon_full_params(model).__enter__(), "already")

    class Summoner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def forward(self, x):
            with FSDP.summon_full_params(outer):
                return self.lin(x)

    outer = FSDP(Summoner(), process_group=pg)
    c.raises("inside forward", AssertionError, lambda: outer(x), "during forward/backward")


def wrap_api_cases(c, pg):
    """test_wrap.py: wrap() inside enable_wrap wraps with its arguments, overrides win, outside it is a no-op,
    enable_wrap does not nest."""
    lin = nn.Linear(5, 5)
    c.true("wrap outside enable_wrap is the module", wrap(lin) is lin)
    with enable_wrap(wrapper_cls=FSDP, process_group=pg):
        layer = wrap(nn.Linear(5, 5))
        c.true("wrapped", isinstance(layer, FSDP) and layer.process_group is pg)
        solo = pt_dist.new_group([c.rank], use_local_synchronization=True)
        other = wrap(nn.Linear(5, 5), process_group=solo)
        c.true("overrides", other.process_group is solo)
        c.raises("nested enable_wrap", NotImplementedError,
                lambda: enable_wrap(wrapper_cls=FSDP).__enter__(), "already within an autowrap context")
    c.true("after the context, wrap is a no-op again", wrap(lin) is lin)


def state_dict_cases(c, pg):
    """test_fsdp_state_dict.py: a unit inside a plain parent (torch's checkpoint_wrapper) contributes its entries
    under the parent's prefix, as torch's FSDP does; the wrong config for a type is refused."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    local = _net()
    # checkpoint_wrapper's own post-hook strips the "_checkpoint_wrapped_module." FSDP's entries arrive under
    for parent, prefix in ((checkpoint_wrapper(FSDP(copy.deepcopy(local), process_group=pg)), ""),
                           (nn.Sequential(FSDP(copy.deepcopy(local), process_group=pg)), "0.")):
        sd = parent.state_dict()
        want = {f"{prefix}{k}": v for k, v in local.state_dict().items()}
        c.true(f"keys under the parent's prefix: {sorted(sd)}", sorted(sd) == sorted(want))
        for k, v in want.items():
            if k in sd:
                c.equal(f"value {k}", sd[k], v, rtol=0, atol=0)
    model = _wrapped(pg)
    c.raises("FULL_STATE_DICT with LocalStateDictConfig", RuntimeError,
            lambda: FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, LocalStateDictConfig()).__enter__(),
            "Expected state_dict_config of type")
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
        c.true("the right config is taken", len(model.state_dict()) == len(local.state_dict()))


def _bn_net(seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(6, 7), nn.BatchNorm1d(7), nn.Sequential(nn.Linear(7, 5), nn.Tanh()), nn.Linear(5, 3))
    m[1].running_mean.uniform_(-1, 1)
    m[1].num_batches_tracked.fill_(seed + 3)
    return m.eval()


def plain_parent_load_cases(c, pg):
    """test_fsdp_state_dict.py (wrapper modules around FSDP, test_state_dict_load_into_local_module): a plain
    parent's load_state_dict reaches the units inside it, nested unit and buffers included, for full, sharded and
    local state dicts; a key the model lacks is reported, the flat parameter never."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    def parent(kind):
        model = _bn_net(0)
        model[2] = FSDP(model[2], process_group=pg)
        outer = FSDP(model, process_group=pg)
        return checkpoint_wrapper(outer) if kind == "checkpoint_wrapper" else nn.Sequential(outer)

    src, x = _bn_net(1), _batch(0, 9)
    for kind, prefix in (("checkpoint_wrapper", ""), ("Sequential", "0.")):
        want = {prefix + k: v for k, v in src.state_dict().items()}
        loaded = parent(kind)
        keys = loaded.load_state_dict(want)
        c.true(f"{kind}: nothing missing or unexpected: {keys}", not keys.missing_keys and not keys.unexpected_keys)
        got = loaded.state_dict()
        c.true(f"{kind}: the same keys", sorted(got) == sorted(want))
        for k in want:
            c.equal(f"{kind} full {k}", got.get(k, torch.zeros(())), want[k], rtol=0, atol=0)
        c.equal(f"{kind}: outputs", loaded(x), src(x), rtol=0, atol=0)
        for sd_type in (StateDictType.SHARDED_STATE_DICT, StateDictType.LOCAL_STATE_DICT):
            with FSDP.state_dict_type(loaded, sd_type):
                sd = loaded.state_dict()
            fresh = parent(kind)
            with FSDP.state_dict_type(fresh, sd_type):
                keys = fresh.load_state_dict(sd)
            c.true(f"{kind} {sd_type.name}: {keys}", not keys.missing_keys and not keys.unexpected_keys)
            c.equal(f"{kind} {sd_type.name}: outputs", fresh(x), src(x), rtol=0, atol=0)
        short = {k: v for k, v in want.items() if not k.endswith("2.0.weight")}
        keys = parent(kind).load_state_dict(short, strict=False)
        c.true(f"{kind}: the one missing key: {keys.missing_keys}",
               len(keys.missing_keys) == 1 and keys.missing_keys[0].endswith("2.0.weight"))
        strict = parent(kind)
        c.raises(f"{kind}: strict", RuntimeError, lambda m=strict, s=short: m.load_state_dict(s), "2.0.weight")


def checkpoint_cases(c, pg):
    """test_fsdp_checkpoint.py (test_checkpoint_fsdp_wrapping, reentrant): an FSDP model run under
    torch.utils.checkpoint(..., use_reentrant=True), and checkpoint_wrapper(FSDP(seq)) with the reentrant
    implementation, train as the plain FSDP model (the flat parameter got no gradient before)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    from torch.utils.checkpoint import checkpoint

    base = FSDP(_net(), process_group=pg)
    direct = FSDP(_net(), process_group=pg)
    wrapped = checkpoint_wrapper(FSDP(_net(), process_group=pg), checkpoint_impl=CheckpointImpl.REENTRANT)
    runs = [(base, lambda m, x: m(x)), (direct, lambda m, x: checkpoint(m, x, use_reentrant=True)),
            (wrapped, lambda m, x: m(x))]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m, _ in runs]
    for step in range(3):
        x = _batch(c.rank, step).requires_grad_()  # (reentrant checkpointing needs an input that requires grad)
        for (m, fwd), opt in zip(runs, opts):
            opt.zero_grad()
            fwd(m, x).sum().backward()
            opt.step()
        for name, (m, _) in zip(("checkpoint(use_reentrant=True)", "checkpoint_wrapper REENTRANT"), runs[1:]):
            for a, b in zip(m.parameters(), base.parameters()):
                c.equal(f"{name} step {step}", a, b, rtol=1e-6, atol=1e-7)


def argument_cases(c, pg):
    """Arguments refused before any communication, naming the value: CPUOffload(offload_params=True) with the
    parameters off the CPU, a cpu_offload that is not a CPUOffload, a use_orig_params that is not a bool."""
    from pt_dist.fsdp import CPUOffload

    c.raises("offload with meta parameters", ValueError, lambda: FSDP(
        nn.Linear(2, 2, device="meta"), process_group=pg, cpu_offload=CPUOffload(offload_params=True)), "['meta']")
    c.raises("cpu_offload=True", TypeError, lambda: FSDP(nn.Linear(2, 2), process_group=pg, cpu_offload=True),
            "CPUOffload")
    c.raises("use_orig_params", TypeError, lambda: FSDP(nn.Linear(2, 2), process_group=pg, use_orig_params="yes"),
            "'yes'")
    unit = FSDP(nn.Linear(2, 2), process_group=pg, cpu_offload=CPUOffload(offload_params=True))
    c.true("offload on the CPU is taken", unit.cpu_offload.offload_params and unit._flat_param.device.type == "cpu")


CASES = (grad_acc_cases, grad_acc_interleaved_cases, summon_cases, wrap_api_cases, state_dict_cases,
         plain_parent_load_cases, checkpoint_cases, argument_cases)


@upstream_cases.parametrize(CASES, expect=8)
def test_upstream_fsdp1_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180)
