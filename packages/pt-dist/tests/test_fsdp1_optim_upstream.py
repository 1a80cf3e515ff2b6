"""torch's test/distributed/fsdp/test_fsdp_optim_state.py (TestFSDPOptimState), ported to pt_dist's FSDP1 on CPU,
world size 2, each method a case below, checked as upstream checks it: against the unwrapped model trained the
same way (every rank feeds the same batches, so the averaged gradients are the unwrapped model's), or against
the optimizer state of a second FSDP model trained the same way (upstream's ``_test_load_optim_state``).

Ported (use_orig_params=False): test_full_optim_state_dict_keys; test_optim_state_dict_nested (full, rank 0
only, sharded; one or two param groups; ranks listing the parameters in different orders; optim_input);
test_full_optim_state_dict_nested_invalid; test_shard_full_optim_state_dict_nested and _halve_world_size;
test_scatter_full_optim_state_dict_nested and _halve_world_size; test_flatten_sharded_optim_state_dict_nested
(each also through optim_state_dict / optim_state_dict_to_load under FULL and SHARDED settings, into the same
and an alternative wrapping, and an FSDP root in place of upstream's transformer);
test_shard_full_optim_state_dict_unmanaged_params; test_rekey_optim_state_dict_to_ids / _to_names;
test_optim_input_warning; test_save_load_without_0th_param_state; test_optim_state_without_param_groups;
test_with_empty_optimizer_state; test_interface_arguments; test_state_dict_with_none_tensor_state;
test_with_no_shard (these last two with ``use_orig_params`` both ways, as upstream). The three
``use_orig_params=True``-only methods are in test_fsdp1_optim_orig_upstream.py.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from pathlib import Path

import pt_dist
import torch
from pt_dist.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    OptimStateKeyType,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402


class Nested(nn.Module):
    """upstream's NestedModel in small: blocks, a bias the optimizer may leave out, two param groups."""

    def __init__(self, extra: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.block0 = nn.Sequential(nn.Linear(5, 6), nn.ReLU())
        self.block1 = nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 7))
        self.block2 = nn.Sequential(nn.Linear(7, 4), nn.Tanh(), nn.Linear(4, 3))
        self.bias = nn.Parameter(torch.zeros(3))
        if extra:
            self.block1.append(nn.Linear(7, 7))

    def forward(self, x):
        return self.block2(self.block1(self.block0(x))) + self.bias


def _wrap(model, pg, how="wrap", **kw):
    if how == "wrap":  # non-FSDP root, nested units
        model.block1 = FSDP(model.block1, process_group=pg, **kw)
        model.block2[2] = FSDP(model.block2[2], process_group=pg, **kw)
        model.block2 = FSDP(model.block2, process_group=pg, **kw)
    elif how == "wrap_alt":
        model.block0 = FSDP(model.block0, process_group=pg, **kw)
        model.block2 = FSDP(model.block2, process_group=pg, **kw)
    else:  # "root": an FSDP root over nested units
        model.block1 = FSDP(model.block1, process_group=pg, **kw)
        model = FSDP(model, process_group=pg, **kw)
    return model


def _groups(model, multiple: bool, reverse: bool = False):
    order = (lambda ps: ps[::-1]) if reverse else list
    if not multiple:
        return [{"params": order(list(model.parameters()))}]
    first = [*model.block0.parameters(), *model.block1.parameters()]
    return [{"params": order(first)}, {"params": order(list(model.block2.parameters())), "weight_decay": 0.9}]


def _train(model, opt, steps, start=0):
    for i in range(start, start + steps):
        opt.zero_grad()
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(i))  # the same batch on every rank
        model(x).square().mean().backward()
        opt.step()


def _pair(pg, how="wrap", multiple=False, reverse=False, steps=2, opt_cls=torch.optim.Adam, **kw):
    model = _wrap(Nested(), pg, how, **kw)
    opt = opt_cls(_groups(model, multiple, reverse), lr=1e-2)
    _train(model, opt, steps)
    return model, opt


def _ref(multiple=False, steps=2):
    model = Nested()
    opt = torch.optim.Adam(_groups(model, multiple), lr=1e-2)
    _train(model, opt, steps)
    names = {id(p): n for n, p in model.named_parameters()}
    return model, opt, {names[id(p)]: st for p, st in opt.state.items()}


def _value(v):
    return v.full_tensor() if hasattr(v, "full_tensor") else v


def _same_named_state(c, what, osd, ref_state):
    c.true(f"{what}: names {sorted(osd['state'])} vs {sorted(ref_state)}", sorted(osd["state"]) == sorted(ref_state))
    for name, st in ref_state.items():
        for k, v in st.items():
            c.equal(f"{what}: {name}.{k}", _value(osd["state"].get(name, {}).get(k)), v, rtol=1e-5, atol=1e-7)


def _same_flat_state(c, what, got, want):
    """Two optimizer state dicts in the optimizer's own form (indices), as upstream's _check_same_state."""
    c.true(f"{what}: indices {sorted(got['state'])} vs {sorted(want['state'])}",
           sorted(got["state"]) == sorted(want["state"]))
    for i, st in want["state"].items():
        for k, v in st.items():
            g = got["state"].get(i, {}).get(k)
            c.true(f"{what}: state {i}.{k}", g is not None and (torch.allclose(g, v, rtol=1e-5, atol=1e-7)
                                                                 if torch.is_tensor(v) else g == v))
    c.true(f"{what}: param_groups {got['param_groups']} vs {want['param_groups']}",
           got["param_groups"] == want["param_groups"])


def _full_params(model):
    return {k: v.clone() for k, v in (model.state_dict() if isinstance(model, FSDP) else _plain_full(model)).items()}


def _plain_full(model):
    with FSDP.summon_full_params(model, writeback=False):
        return {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone() for n, p in model.named_parameters()}


def nested_cases(c, pg):
    """test_optim_state_dict_nested: full (every rank / rank 0 only) and sharded, one or two param groups,
    odd ranks listing the parameters in reverse, with and without optim_input, against the unwrapped model."""
    for multiple in (False, True):
        _, _, ref_state = _ref(multiple)
        for reverse in (False, True):
            model, opt = _pair(pg, multiple=multiple, reverse=reverse and c.rank % 2 == 1)
            for rank0_only in (False, True):
                for use_input in (False, True):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", FutureWarning)
                        osd = FSDP.full_optim_state_dict(model, opt, rank0_only=rank0_only,
                                                         optim_input=opt.param_groups if use_input else None)
                    what = f"full multiple={multiple} reverse={reverse} rank0_only={rank0_only} input={use_input}"
                    if rank0_only and c.rank != 0:
                        c.true(f"{what}: empty off rank 0", osd == {})
                        continue
                    _same_named_state(c, what, osd, ref_state)
                    want = [sorted(n for n, p in _ref_names(multiple, g)) for g in range(len(opt.param_groups))]
                    c.true(f"{what}: group params", [sorted(g["params"]) for g in osd["param_groups"]] == want)
            sharded = FSDP.sharded_optim_state_dict(model, opt)
            _same_named_state(c, f"sharded multiple={multiple} reverse={reverse}", sharded, ref_state)


def _ref_names(multiple, g):
    model = Nested()
    names = {id(p): n for n, p in model.named_parameters()}
    return [(names[id(p)], p) for p in _groups(model, multiple)[g]["params"]]


def keys_cases(c, pg):
    """test_full_optim_state_dict_keys: with an ignored module and activation checkpointing applied to every
    ``nn.Sequential`` after wrapping, the optimizer state's names are the full model state dict's."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    model = Nested()
    model.block1 = FSDP(model.block1, process_group=pg)
    model = FSDP(model, process_group=pg, ignored_modules=[model.block0])
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.Sequential))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    osd = FSDP.full_optim_state_dict(model, opt, rank0_only=False)
    params = {k for k in model.state_dict() if "running" not in k}
    c.true(f"keys: {sorted(osd['state'])} vs {sorted(params)}", set(osd["state"]) == params)


def invalid_cases(c, pg):
    """test_full_optim_state_dict_nested_invalid: a rank whose optimizer lacks a parameter rank 0's holds makes
    every rank raise (torch's RuntimeError), not hang."""
    model = _wrap(Nested(), pg)
    params = list(model.parameters())
    opt = torch.optim.Adam(params if c.rank == 0 else params[:-1], lr=1e-2)
    _train(model, opt, 1)
    c.raises("rank 1 lacks a parameter", RuntimeError, lambda: FSDP.full_optim_state_dict(model, opt),
                 "requires each rank to have at least the optimizer states needed by rank 0")


def load_cases(c, pg):
    """test_shard_full_optim_state_dict_nested, test_scatter_full_optim_state_dict_nested,
    test_flatten_sharded_optim_state_dict_nested (and the transformer variants' FSDP root): the state of model 1,
    resharded for model 2 (another wrapping, trained the same way), equals model 2's own; loaded, the next step
    is model 1's next step."""
    for how in ("wrap", "wrap_alt", "root"):
        for multiple in (False, True) if how != "root" else (False,):  # (a root's flat parameter spans groups)
            src, src_opt = _pair(pg, multiple=multiple)
            full = FSDP.full_optim_state_dict(src, src_opt, rank0_only=False)
            full0 = FSDP.full_optim_state_dict(src, src_opt)  # rank 0 only
            sharded = FSDP.sharded_optim_state_dict(src, src_opt)
            with FSDP.state_dict_type(src, StateDictType.FULL_STATE_DICT, FullStateDictConfig(),
                                      FullOptimStateDictConfig()):
                osd_full = FSDP.optim_state_dict(src, src_opt)
            with FSDP.state_dict_type(src, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                                      ShardedOptimStateDictConfig()):
                osd_sharded = FSDP.optim_state_dict(src, src_opt)
            dst, dst_opt = _pair(pg, how, multiple=multiple)
            want = dst_opt.state_dict()
            what = f"into {how} multiple={multiple}"
            _same_flat_state(c, f"shard_full {what}", FSDP.shard_full_optim_state_dict(full, dst, optim=dst_opt),
                             want)
            _same_flat_state(c, f"scatter_full {what}",
                             FSDP.scatter_full_optim_state_dict(full0 if c.rank == 0 else None, dst, optim=dst_opt),
                             want)
            _same_flat_state(c, f"flatten_sharded {what}",
                             FSDP.flatten_sharded_optim_state_dict(sharded, dst, dst_opt), want)
            _same_flat_state(c, f"optim_state_dict FULL {what}",
                             FSDP.optim_state_dict_to_load(dst, dst_opt, osd_full), want)
            loaded = FSDP.optim_state_dict_to_load(dst, dst_opt, osd_sharded)
            _same_flat_state(c, f"optim_state_dict SHARDED {what}", loaded, want)
            dst_opt.load_state_dict(loaded)
            _train(dst, dst_opt, 1, start=2)
            _train(src, src_opt, 1, start=2)
            a, b = _plain_full(dst), _plain_full(src)
            for k in b:
                c.equal(f"{what}: the next step {k}", a[k], b[k], rtol=1e-5, atol=1e-7)


def halve_cases(c, pg):
    """..._nested_halve_world_size: the 2-rank state resharded for a model on a 1-rank group (shard_full and
    scatter_full with group=); the rank outside the group takes no part."""
    src, src_opt = _pair(pg, multiple=True)
    full = FSDP.full_optim_state_dict(src, src_opt, rank0_only=False)
    half = pt_dist.new_group([0])
    if c.rank != 0:
        return
    dst, dst_opt = _pair(half, "wrap_alt", multiple=True)
    want = dst_opt.state_dict()
    _same_flat_state(c, "halve shard_full", FSDP.shard_full_optim_state_dict(full, dst, optim=dst_opt), want)
    _same_flat_state(c, "halve scatter_full",
                     FSDP.scatter_full_optim_state_dict(full, dst, optim=dst_opt, group=half), want)
    c.raises("group= not the model's", ValueError,
                 lambda: FSDP.scatter_full_optim_state_dict(full, dst, optim=dst_opt, group=pg), "group=")


def unmanaged_cases(c, pg):
    """test_shard_full_optim_state_dict_unmanaged_params: a parameter the saved state lacks inside a unit is
    torch's ValueError; outside any unit it is left without state and the rest loads."""
    src, src_opt = _pair(pg)
    full = FSDP.full_optim_state_dict(src, src_opt, rank0_only=False)
    inside = _wrap(Nested(extra=True), pg)
    opt = torch.optim.Adam(inside.parameters(), lr=1e-2)
    c.raises("a unit's parameter without state", ValueError,
                 lambda: FSDP.shard_full_optim_state_dict(full, inside, optim=opt),
                 "All unflattened parameters comprising a single flat parameter")
    outside = _wrap(Nested(), pg)
    outside.extra = nn.Linear(3, 3)  # (not called: the model-parallel part upstream's case adds)
    opt = torch.optim.Adam(outside.parameters(), lr=1e-2)
    full["param_groups"][0]["params"] += ["extra.weight", "extra.bias"]  # upstream's added entry
    got = FSDP.shard_full_optim_state_dict(full, outside, optim=opt)
    extra_idx = [i for i, p in enumerate(outside.parameters()) if p is outside.extra.weight][0]
    c.true("a plain parameter without state: none, the rest loaded", extra_idx not in got["state"]
           and len(got["state"]) == len(src_opt.state_dict()["state"]))
    opt.load_state_dict(got)


def rekey_cases(c, pg):
    """test_rekey_optim_state_dict_to_ids / _to_names: to the unwrapped optimizer's indices and back."""
    for multiple in (False, True):
        model, opt = _pair(pg, multiple=multiple)
        ref, ref_opt, _ = _ref(multiple)
        full = FSDP.full_optim_state_dict(model, opt, rank0_only=False)
        ids = FSDP.rekey_optim_state_dict(full, OptimStateKeyType.PARAM_ID, ref, optim=ref_opt)
        _same_flat_state(c, f"to ids multiple={multiple}", ids, ref_opt.state_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            by_input = FSDP.rekey_optim_state_dict(full, OptimStateKeyType.PARAM_ID, ref,
                                                   optim_input=_groups(ref, multiple))
        _same_flat_state(c, f"to ids by optim_input multiple={multiple}", by_input, ref_opt.state_dict())
        names = FSDP.rekey_optim_state_dict(ref_opt.state_dict(), OptimStateKeyType.PARAM_NAME, ref, optim=ref_opt)
        got = FSDP.shard_full_optim_state_dict(names, model, optim=opt)
        _same_flat_state(c, f"to names, sharded multiple={multiple}", got, opt.state_dict())
        opt.load_state_dict(got)
        ref_opt.load_state_dict(ids)
        _train(model, opt, 1, start=2)
        _train(ref, ref_opt, 1, start=2)
        a = _plain_full(model)
        for n, p in ref.named_parameters():
            c.equal(f"rekeyed, the next step {n}", a[n], p, rtol=1e-5, atol=1e-7)
    c.raises("a key type that is not one", ValueError,
                 lambda: FSDP.rekey_optim_state_dict(full, "names", ref, optim=ref_opt), "PARAM_NAME or PARAM_ID")


def warning_cases(c, pg):
    """test_optim_input_warning: optim_input is deprecated (FutureWarning) wherever torch takes it."""
    model, opt = _pair(pg)
    ref, ref_opt, _ = _ref()
    full = FSDP.full_optim_state_dict(model, opt, rank0_only=False)
    calls = {
        "full_optim_state_dict": lambda: FSDP.full_optim_state_dict(model, opt, optim_input=model.parameters()),
        "shard_full_optim_state_dict": lambda: FSDP.shard_full_optim_state_dict(full, model,
                                                                                optim_input=model.parameters()),
        "scatter_full_optim_state_dict": lambda: FSDP.scatter_full_optim_state_dict(
            full if c.rank == 0 else None, model, optim_input=model.parameters()),
        "rekey to ids": lambda: FSDP.rekey_optim_state_dict(full, OptimStateKeyType.PARAM_ID, ref,
                                                            optim_input=ref.parameters()),
        "rekey to names": lambda: FSDP.rekey_optim_state_dict(ref_opt.state_dict(), OptimStateKeyType.PARAM_NAME,
                                                              ref, optim_input=ref.parameters()),
    }
    for what, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        c.true(f"{what}: FutureWarning", any(issubclass(w.category, FutureWarning) and
                                             "`optim_input` argument is deprecated" in str(w.message) for w in caught))


def edge_cases(c, pg):
    """test_save_load_without_0th_param_state, test_optim_state_without_param_groups,
    test_with_empty_optimizer_state, test_interface_arguments, test_state_dict_with_none_tensor_state,
    test_with_no_shard."""
    model = _wrap(Nested(), pg, "wrap_alt")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    c.true("no step yet: no state", FSDP.optim_state_dict(model, opt)["state"] == {})
    _train(model, opt, 2)
    full = FSDP.full_optim_state_dict(model, opt, rank0_only=False)

    class Unused(nn.Module):  # upstream's: lin1, the optimizer's first parameter, never runs
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = nn.Linear(5, 5), nn.Linear(5, 5)

        def forward(self, x):
            return torch.relu(self.lin2(x))

    unused = Unused()
    unused.lin1, unused.lin2 = FSDP(unused.lin1, process_group=pg), FSDP(unused.lin2, process_group=pg)
    unused = FSDP(unused, process_group=pg)
    u_opt = torch.optim.Adam(unused.parameters(), lr=1e-2)
    for step in range(2):
        unused(torch.randn(2, 5, generator=torch.Generator().manual_seed(step))).sum().backward()
        u_opt.step()
        if step == 0:
            u_full = FSDP.full_optim_state_dict(unused, u_opt, rank0_only=False)
            c.true(f"the unused unit has no state: {sorted(u_full['state'])}", sorted(u_full["state"]) ==
                   ["lin2.bias", "lin2.weight"])
            flat = FSDP.shard_full_optim_state_dict(u_full, unused)
            _same_flat_state(c, "without the 0th state, FULL", flat, u_opt.state_dict())
            back = FSDP.flatten_sharded_optim_state_dict(FSDP.sharded_optim_state_dict(unused, u_opt), unused, u_opt)
            _same_flat_state(c, "without the 0th state, SHARDED", back, u_opt.state_dict())
            u_opt.load_state_dict(flat)
    osd = opt.state_dict()
    no_groups = FSDP.optim_state_dict(model, opt, optim_state_dict={"state": osd["state"]})
    c.true("without param_groups in, none out", "param_groups" not in no_groups)
    no_groups["param_groups"] = full["param_groups"]
    _same_flat_state(c, "param_groups added back", FSDP.optim_state_dict_to_load(model, opt, no_groups), osd)
    c.true("FULL by default: plain tensors", all(not hasattr(v, "full_tensor") for st in full["state"].values()
                                                 for v in st.values()))
    direct = FSDP.optim_state_dict(model, opt, optim_state_dict=osd)
    _same_named_state(c, "explicit optim_state_dict=", direct, full["state"])
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT, None,
                              ShardedOptimStateDictConfig(offload_to_cpu=False)):
        sharded = FSDP.optim_state_dict(model, opt)
    c.true("SHARDED: the units' states are DTensors", all(hasattr(sharded["state"][n]["exp_avg"], "full_tensor")
                                                          for n in sharded["state"] if n.startswith("block2")))
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, None,
                              FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        r0 = FSDP.optim_state_dict(model, opt)
    c.true("FULL rank0_only: empty off rank 0", (r0 == {}) == (c.rank != 0))
    before = opt.state_dict()
    opt.load_state_dict({"state": {}, "param_groups": before["param_groups"]})
    FSDP.optim_state_dict_to_load(model, opt, direct, load_directly=True)
    _same_flat_state(c, "load_directly=True", opt.state_dict(), before)

    for opt_cls, orig in itertools.product((torch.optim.SGD, torch.optim.Adam), (False, True)):
        model, opt = _pair(pg, opt_cls=opt_cls, use_orig_params=orig)
        for p in (p for g in opt.param_groups for p in g["params"]):  # (plain SGD keeps no state of its own)
            if not orig or p.numel():  # (use_orig_params: no state where a parameter has no element here)
                opt.state[p]["custom_float"], opt.state[p]["custom_none"] = 2.74, None
        back = FSDP.optim_state_dict_to_load(model, opt, FSDP.optim_state_dict(model, opt))
        c.true(f"{opt_cls.__name__} use_orig_params={orig}: non-tensor states survive", back["state"] and all(
            st["custom_float"] == 2.74 and st["custom_none"] is None for st in back["state"].values()))

    for orig in (False, True):
        model, opt = _pair(pg, "root", sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=orig)
        want = opt.state_dict()
        got = FSDP.optim_state_dict_to_load(model, opt, FSDP.optim_state_dict(model, opt))
        _same_flat_state(c, f"NO_SHARD round trip use_orig_params={orig}", got, want)


CASES = (nested_cases, keys_cases, invalid_cases, load_cases, halve_cases, unmanaged_cases, rekey_cases,
         warning_cases, edge_cases)


@upstream_cases.parametrize(CASES, expect=9)
def test_upstream_fsdp1_optim_state_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180)
