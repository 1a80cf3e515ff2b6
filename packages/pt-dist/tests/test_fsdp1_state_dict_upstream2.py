"""torch's test/distributed/fsdp/test_fsdp_state_dict.py (class ``TestFSDPStateDict``), ported to pt_dist's FSDP1,
CPU, world size 2, on tcp and shm; part 2 of 2 (helpers and part 1: test_fsdp1_state_dict_upstream.py).

Ported here:
- ``test_state_dict_save_load_flow``: FSDP(Model with an FSDP inner, called twice per forward) trained 3 steps,
  saved (FULL / SHARDED / LOCAL, moved to CPU or not), loaded into a zeroed FSDP model: pt_dist's DDP's values.
- ``test_fsdp_state_dict_keys``: LOCAL ``{_flat_param, inner._flat_param}``; FULL and SHARDED the plain model's.
- ``test_state_dict_skip_module``: ``SkipModel`` through ``enable_wrap``/``wrap``, a Linear detached while
  wrapping and reattached (not FSDP's): keys, loading into a new FSDP model and (not LOCAL) into a plain one.
- ``test_state_dict_with_ignored_modules``: ``ignored_modules=[outer]``, optionally an inner
  ``FSDP(inner, ignored_modules=[inner])`` (``ignore_inner``: none of its parameters managed), ``state_dict(prefix=
  "foo.")``, FULL and SHARDED, MixedPrecision fp16 on/off: ignored parameters and buffers are the module's own
  tensors (same ``data_ptr``, two saves) and stay fp32; a buffer cast to fp16 for compute is saved as a fp32 copy;
  loadable into the plain model.
- ``test_state_dict_type``: leaving ``FSDP.state_dict_type(..., LOCAL_STATE_DICT)`` puts every unit back on FULL.
- ``test_local_state_dict_with_empty_ranks``: a 1-element parameter (rank 1 holds padding only), LOCAL restores.
- ``test_torch_save_load``: LOCAL through ``torch.save``/``torch.load`` of a BytesIO. Adapted: the flat parameter
  is a pt_dist DTensor, not a ShardedTensor, so the weights-only allow-list names pt_dist's DTensor classes
  (``getattr``, ``DTensor``, ``DTensor._rebuild``, ``DTensorSpec``, ``TensorMeta``, ``DeviceMesh``, ``Shard``);
  beyond upstream, what was loaded loads into a zeroed model.
- ``test_shared_module_and_shared_parameter``: FULL holds both names of the shared parameter
  (``random_parameter``, ``shared_parameter``) and of the shared module (``net2.*``, ``net3.*``), equal.
- ``test_full_state_dict_missing_unexpected_keys_cleaned``: ``strict=False`` names have no FSDP prefix.
- ``test_state_dict_with_manual_ac_wrapper``: ``FSDP(checkpoint_wrapper(layer))`` against ``FSDP(layer)``, FULL
  (``rank0_only`` on/off) and SHARDED: the same keys, loaded (beyond upstream: into a fresh zeroed model), equal.

Not ported here: ``test_fsdp_state_dict_with_activation_checkpoint`` (outside this port's brief; a unit inside a
plain parent or ``checkpoint_wrapper`` is in test_fsdp1_upstream.py), ``test_state_dict_load_into_local_module``
(test_fsdp_upstream.py), ``test_wrong_state_dict_config`` (test_fsdp1_upstream.py).
``test_sharded_load_multi_backend_pg`` is here on a plain group (``sharded_load_new_group_cases``), and
``TestFSDPStateDict4GPUs.test_local_state_dict_reshard`` at world size 4 on CPU (``local_reshard_cases``: the
LOCAL rows cut anew for two ranks, DTensors in place of ShardedTensors)."""

from __future__ import annotations

import contextlib
import copy
import io
import sys
from pathlib import Path

import pt_dist
import torch
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.fsdp.wrap import enable_wrap, wrap
from pt_dist.tensor import DTensor
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import test_fsdp1_state_dict_upstream as base  # noqa: E402
import upstream_cases  # noqa: E402
from test_fsdp1_state_dict_upstream import FULL, KINDS, LOCAL, SHARDED, mgr, same, states, zero  # noqa: E402

FP16 = base.FP16


class Model(nn.Module):
    """upstream ``Model``: inner Linear(4, 4) (an FSDP unit with ``wrap_fsdp``) run twice, outer Linear(4, 5);
    optional persistent and non-persistent buffers."""

    def __init__(self, wrap_fsdp, register_buffers=False, mixed_precision=False, pg=None, ignore_inner=False):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        if register_buffers:
            self.inner.register_buffer("buffer", torch.randn(5, 5))
            self.inner.register_buffer("non_persistent_buffer", torch.randn(5, 5), persistent=False)
        if wrap_fsdp:
            self.inner = FSDP(self.inner, process_group=pg, mixed_precision=FP16 if mixed_precision else None,
                              ignored_modules=[self.inner] if ignore_inner else None)
        self.outer = nn.Linear(4, 5)
        if register_buffers:
            self.outer.register_buffer("buffer", torch.randn(5, 5))
            self.outer.register_buffer("non_persistent_buffer", torch.randn(5, 5), persistent=False)

    def forward(self, x):
        return self.outer(self.inner(x) + self.inner(x))


def _train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.rand(64, 4, requires_grad=True)
    for _ in range(3):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()


def _to_cpu(v):
    if isinstance(v, DTensor):
        return DTensor.from_local(v.to_local().cpu(), v.device_mesh, v.placements, shape=v.shape, stride=v.stride())
    return v.cpu()


def save_load_flow_cases(c, pg):
    """test_state_dict_save_load_flow: FSDP trained, saved, loaded into a blank FSDP model == DDP trained alike."""
    torch.manual_seed(0)
    ddp = pt_dist.nn.parallel.DistributedDataParallel(Model(False), process_group=pg)
    _train(ddp)
    want = [p.detach() for p in ddp.parameters()]
    for kind in KINDS:
        for move_to_cpu in (True, False):
            torch.manual_seed(0)
            model = FSDP(Model(True, pg=pg), process_group=pg)
            _train(model)
            blank = FSDP(Model(True, pg=pg), process_group=pg)
            zero(blank)
            with FSDP.state_dict_type(model, kind):
                sd = model.state_dict()
            if move_to_cpu:
                sd = {k: _to_cpu(v) for k, v in sd.items()}
            with FSDP.state_dict_type(blank, kind):
                blank.load_state_dict(sd, strict=True)
            got = states(blank)
            c.true(f"flow {kind.name}: {len(got)} parameters", len(got) == len(want))
            for i, (a, b) in enumerate(zip(got, want)):
                c.equal(f"flow {kind.name} cpu={move_to_cpu}: parameter {i} as DDP's", a, b, rtol=0, atol=0)


def keys_cases(c, pg):
    """test_fsdp_state_dict_keys."""
    local = set(Model(False).state_dict())
    for kind in KINDS:
        model = FSDP(Model(True, pg=pg), process_group=pg)
        with FSDP.state_dict_type(model, kind):
            keys = set(model.state_dict())
        want = {"_flat_param", "inner._flat_param"} if kind is LOCAL else local
        c.true(f"keys {kind.name}: {sorted(keys)}", keys == want)


class SkipModel(nn.Module):
    """common_fsdp's ``SkipModel(double_nest=True)``: ``nested_linear`` wrapped (inside it a wrapped Linear)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(10, 10, bias=False)
        self.linear_skip = nn.Sequential(nn.Linear(10, 10, bias=False))
        self.nested_linear = wrap(nn.Sequential(wrap(nn.Linear(10, 10, bias=False))), device_id=torch.device("cpu"))

    def forward(self, x):
        return self.nested_linear(self.linear_skip(self.linear(x)))


def _skip_model(pg, wrap_fsdp=True):
    """upstream ``_create_module``: ``linear_skip`` detached while the root is wrapped, then put back."""
    with enable_wrap(wrapper_cls=FSDP, process_group=pg) if wrap_fsdp else contextlib.nullcontext():
        module = SkipModel()
        skip = module.linear_skip
        del module.linear_skip
        fsdp = wrap(module)
        module.linear_skip = skip
        return fsdp


def skip_module_cases(c, pg):
    """test_state_dict_skip_module (double_nest=True)."""
    expected = sorted(SkipModel().state_dict())  # outside enable_wrap: nothing wrapped
    for kind in KINDS:
        fsdp = _skip_model(pg)
        fsdp(torch.randn(1, 10)).sum().backward()
        with FSDP.state_dict_type(fsdp, kind):
            sd = fsdp.state_dict()
        if kind is not LOCAL:
            c.true(f"skip {kind.name}: keys {sorted(sd)}", sorted(sd) == expected)
        new = _skip_model(pg)
        zero(new)
        old = [p.detach().clone() for p in fsdp.parameters()]
        c.true(f"skip {kind.name}: differ", all(not torch.equal(a, b) for a, b in zip(old, new.parameters())))
        with FSDP.state_dict_type(new, kind):
            new.load_state_dict(sd if kind is LOCAL else copy.deepcopy(sd), strict=True)
        eq = [torch.equal(a, b) for a, b in zip(old, new.parameters())]
        c.true(f"skip {kind.name}: loaded {eq}", len(eq) == len(old) == 3 and all(eq))
        local = _skip_model(pg, wrap_fsdp=False)
        zero(local)
        if kind is LOCAL:
            continue
        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd.items()}  # _gather_state_dict
        want = states(fsdp)  # (collective)
        if c.rank == 0:
            local.load_state_dict(full, strict=True)
            same(c, f"skip {kind.name}: into the plain model", want, states(local))


def ignored_modules_cases(c, pg):
    """test_state_dict_with_ignored_modules."""
    for kind, inner_out in ((k, i) for k in (FULL, SHARDED) for i in (False, True)):
        for prefix, mp in ((p, m) for p in ("foo.", "") for m in (True, False)):
            what = f"ignored {kind.name} prefix={prefix!r} mp={mp} ignore_inner={inner_out}"
            model = Model(True, register_buffers=True, mixed_precision=mp, pg=pg, ignore_inner=inner_out)
            named = {model.outer.bias: "outer.bias", model.outer.weight: "outer.weight"}
            if inner_out:  # the inner unit ignores its own module: its parameters are the module's own too
                named.update({model.inner.weight: "inner.weight", model.inner.bias: "inner.bias"})
            bufs = {model.inner.buffer: "inner.buffer", model.outer.buffer: "outer.buffer"}
            if mp and not inner_out:  # as upstream: cast for compute, a fp32 copy again in the state dict
                fp32 = bufs.pop(model.inner.buffer)
            fsdp = FSDP(model, process_group=pg, ignored_modules=[model.outer], mixed_precision=FP16 if mp else None)
            with FSDP.state_dict_type(fsdp, kind):
                sd1 = fsdp.state_dict(prefix=prefix)
            sd1 = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in sd1.items()}
            full = states(fsdp, buffers=False)
            for t, name in {**named, **bufs}.items():
                got = sd1.get(prefix + name)
                c.true(f"{what}: {name} not cloned", got is not None and got.data_ptr() == t.data_ptr())
            c.true(f"{what}: buffers fp32", all(sd1[prefix + n].dtype == torch.float32 for n in bufs.values()))
            if mp and not inner_out:
                c.true(f"{what}: the cast buffer saved fp32", sd1[prefix + fp32].dtype == torch.float32
                       and model.inner.buffer.dtype == torch.float16)
            plain = Model(False, register_buffers=True)
            zero(plain)
            plain.load_state_dict({k[len(prefix):]: v for k, v in sd1.items()}, strict=True)
            same(c, f"{what}: into the plain model", full, [p.detach() for p in plain.parameters()])
            with FSDP.state_dict_type(fsdp, kind):
                sd2 = fsdp.state_dict(prefix=prefix)
            for t, name in {**named, **bufs}.items():
                got = sd2.get(prefix + name)
                c.true(f"{what}: {name} not cloned, second save", got is not None and got.data_ptr() == t.data_ptr()
                       == sd1[prefix + name].data_ptr())


def state_dict_type_cases(c, pg):
    """test_state_dict_type."""
    with enable_wrap(wrapper_cls=FSDP, process_group=pg):
        fsdp = wrap(SkipModel())
    units = FSDP.fsdp_modules(fsdp)
    with FSDP.state_dict_type(fsdp, LOCAL):
        c.true("state_dict_type: LOCAL inside", [u._state_dict_type for u in units] == [LOCAL] * 3)
    c.true("state_dict_type: FULL after", [u._state_dict_type for u in units] == [FULL] * 3)


class _One(nn.Module):
    def __init__(self):
        super().__init__()
        self.my_parameter = nn.Parameter(torch.full((1,), 3.1415926))

    def forward(self, x):
        return self.my_parameter


def empty_ranks_cases(c, pg):
    """test_local_state_dict_with_empty_ranks."""
    model = FSDP(_One(), process_group=pg)
    with FSDP.state_dict_type(model, LOCAL):
        model(None).backward()
        sd = copy.deepcopy(model.state_dict())
        with torch.no_grad(), FSDP.summon_full_params(model):
            c.true("empty ranks: the value", model.my_parameter.item() == torch.tensor(3.1415926).item())
            model.my_parameter.copy_(torch.full((1,), 1.75))
        with FSDP.summon_full_params(model):
            c.true("empty ranks: changed", model.my_parameter.item() == 1.75)
        model.load_state_dict(sd)
        with FSDP.summon_full_params(model):
            c.true("empty ranks: restored", model.my_parameter.item() == torch.tensor(3.1415926).item())


def torch_save_load_cases(c, pg):
    """test_torch_save_load (pt_dist's DTensor classes allow-listed in place of ShardedTensor's)."""
    from pt_dist.device_mesh import DeviceMesh
    from pt_dist.tensor import Shard
    from pt_dist.tensor._dtensor_spec import DTensorSpec, TensorMeta

    model = Model(True, pg=pg)
    with FSDP.state_dict_type(model, LOCAL):
        sd = model.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    with torch.serialization.safe_globals([getattr, DTensor, DTensor._rebuild, DTensorSpec, TensorMeta, DeviceMesh,
                                           Shard]):
        loaded = torch.load(buf)
    c.true(f"torch.save: keys {sorted(loaded)}", sorted(loaded) == sorted(sd) and len(sd) == 3)
    for k, v in loaded.items():
        if isinstance(sd[k], DTensor):
            c.true(f"torch.save {k}: a DTensor", isinstance(v, DTensor) and v.placements == sd[k].placements)
            c.true(f"torch.save {k}: local shard", torch.equal(v.to_local(), sd[k].to_local()))
        else:
            c.true(f"torch.save {k}", torch.equal(v, sd[k]))
    new = Model(True, pg=pg)  # (beyond upstream: what was loaded loads into a zeroed model)
    zero(new)
    with FSDP.state_dict_type(new, LOCAL):
        new.load_state_dict(loaded)
    same(c, "torch.save: loaded back", states(model), states(new))


class Dummy(nn.Module):
    """upstream ``TestDummyModel``: ``net3`` is ``net2``, ``shared_parameter`` is ``random_parameter``."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.net2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.net3 = self.net2
        self.random_parameter = nn.Parameter(torch.randn(10))
        self.shared_parameter = self.random_parameter

    def forward(self, x):
        return self.net3(self.net2(self.net1(x)))


def shared_module_cases(c, pg):
    """test_shared_module_and_shared_parameter."""
    model = FSDP(Dummy(), process_group=pg)
    with FSDP.state_dict_type(model, FULL):
        sd = model.state_dict()
    for a, b in (("random_parameter", "shared_parameter"), ("net2.0.weight", "net3.0.weight"),
                 ("net2.0.bias", "net3.0.bias")):
        c.true(f"shared: {a} == {b} ({sorted(sd)})", a in sd and b in sd and torch.equal(sd[a], sd[b]))


def missing_unexpected_cases(c, pg):
    """test_full_state_dict_missing_unexpected_keys_cleaned."""
    model = base.nested(pg)
    sd = model.state_dict()
    sd.pop(next(iter(sd)))
    sd["unexpected"] = torch.ones(1)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    c.true(f"missing {missing}, unexpected {unexpected}", len(missing) == 1 and len(unexpected) == 1
           and "_fsdp_wrapped_module" not in missing[0] + unexpected[0])


def manual_ac_cases(c, pg):
    """test_state_dict_with_manual_ac_wrapper: FSDP(checkpoint_wrapper(layer)) and FSDP(layer) per layer."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    def wrapped(ac, seed=0):
        model = base.Shared(seed)
        for layers in (model.transformer.encoder.layers, model.transformer.decoder.layers):
            for i, layer in enumerate(layers):
                layers[i] = FSDP(checkpoint_wrapper(layer) if ac else layer, process_group=pg)
        model.transformer = FSDP(model.transformer, process_group=pg)
        return model

    for kind, rank0 in ((FULL, False), (FULL, True), (SHARDED, False)):
        what = f"manual AC {kind.name} rank0={rank0}"
        no_ac, ac = wrapped(False), wrapped(True)
        sds = []
        for model in (no_ac, ac):
            with mgr(model, kind, rank0):
                sds.append(model.state_dict())
        c.true(f"{what}: the same keys ({sorted(set(sds[0]) ^ set(sds[1]))[:4]})", sds[0].keys() == sds[1].keys())
        ac = wrapped(True, seed=1)  # (beyond upstream: loaded into a fresh, zeroed model)
        zero(ac, buffers=True)
        same(c, f"{what}: zeroed", states(ac), states(no_ac), equal=False)
        for model, sd in ((no_ac, sds[0]), (ac, sds[1])):
            with mgr(model, kind, rank0):
                model.load_state_dict(base.broadcast(sd) if rank0 else sd)
        same(c, what, states(ac), states(no_ac))


def sharded_load_new_group_cases(c, pg):
    """test_sharded_load_multi_backend_pg (use_orig_params=True, an auto-wrapped transformer on a group of its
    own; upstream's ``backend="cpu:gloo,cuda:nccl"`` group is this job's backend on CPU): SHARDED saved, the
    original parameters zeroed in place, loaded back (as is, and moved to CPU first), equal."""
    for load_cpu in (True, False):
        group = pt_dist.new_group()
        model = FSDP(base.Shared(0), process_group=group, auto_wrap_policy=base.POLICY, use_orig_params=True)
        FSDP.set_state_dict_type(model, SHARDED)
        sd = model.state_dict()
        copies = [t.detach().clone() for t in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        c.true(f"load_cpu={load_cpu}: zeroed", all(not torch.count_nonzero(p) for p in model.parameters()))
        if load_cpu:
            sd = {k: v.cpu() for k, v in sd.items()}
        model.load_state_dict(sd)
        for (n, p), q in zip(model.named_parameters(), copies, strict=True):
            c.true(f"load_cpu={load_cpu}: {n} restored", torch.equal(p, q))


CASES = (save_load_flow_cases, keys_cases, skip_module_cases, ignored_modules_cases, state_dict_type_cases,
         empty_ranks_cases, torch_save_load_cases, shared_module_cases, missing_unexpected_cases, manual_ac_cases,
         sharded_load_new_group_cases)


def local_reshard_cases(c, pg):
    """TestFSDPStateDict4GPUs.test_local_state_dict_reshard (world size 4): each LOCAL flat parameter gathered
    whole, cut anew in two (``chunk(2)``) as rows of a DTensor over ranks 0-1 (upstream's ShardedTensor
    ``init_from_local_shards``), loaded into the same model on those two ranks: its full state dict is the
    4-rank model's."""
    from pt_dist.device_mesh import DeviceMesh
    from pt_dist.tensor import Shard

    model = FSDP(Model(True, pg=pg), process_group=pg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 4, generator=torch.Generator().manual_seed(c.rank))).sum().backward()
    opt.step()
    with FSDP.state_dict_type(model, LOCAL):
        sd = model.state_dict()
    pair = pt_dist.new_group(ranks=[0, 1])
    mesh = DeviceMesh.from_group(pair, "cpu") if c.rank < 2 else None
    resharded = {}
    for key, value in sd.items():
        if isinstance(value, DTensor):
            full = value.full_tensor()  # (collective over the unit's four ranks)
            if c.rank < 2:
                resharded[key] = DTensor.from_local(full.chunk(2)[c.rank].clone(), mesh, [Shard(0)],
                                                    run_check=False, shape=full.shape, stride=full.stride())
        elif c.rank < 2:
            resharded[key] = value
    if c.rank < 2:
        model2 = FSDP(Model(True, pg=pair), process_group=pair)
        with FSDP.state_dict_type(model2, LOCAL):
            model2.load_state_dict(resharded)
    full1 = model.state_dict()  # (FULL, collective over the four)
    if c.rank < 2:
        full2 = model2.state_dict()
        c.true(f"reshard: keys {sorted(full2)}", sorted(full1) == sorted(full2) and len(full1) == 4)
        for k, v in full1.items():
            c.equal(f"reshard: {k}", full2[k], v, 0, 0)
        c.true("reshard: the rows really moved", resharded["_flat_param"].to_local().numel() !=
               sd["_flat_param"].to_local().numel())


@upstream_cases.parametrize((local_reshard_cases,), expect=1)
def test_fsdp1_local_state_dict_reshard_4_to_2(backend, case, request):
    upstream_cases.check(request, world=4, timeout=180, seed=0)


@upstream_cases.parametrize(CASES, expect=11)
def test_fsdp1_state_dict_upstream2(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180, seed=0)
