"""torch's test/distributed/fsdp/test_fsdp_optim_state.py, its ``use_orig_params=True``-only methods, ported to
pt_dist's FSDP1 on CPU, world size 2, tcp and shm (the rest of the file: test_fsdp1_optim_upstream.py, whose
models and checks these share): test_use_orig_params (``orig_load_cases``), test_no_grad, and
test_compatible_with_trec (torch's own ``_NamedOptimizer``, ``is_named_optimizer=True``).
"""

from __future__ import annotations

import copy
import itertools
import sys
import warnings
from pathlib import Path

import pt_dist
import torch
from pt_dist.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
)
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402
from test_fsdp1_optim_upstream import Nested, _pair, _same_flat_state, _train, _value  # noqa: E402


def orig_load_cases(c, pg):
    """test_use_orig_params (upstream ``_test_load_optim_state_with_optim_state_dict``, use_orig_params=True):
    model 1's optimizer state, saved FULL (all ranks or rank 0 only) or SHARDED, loaded into model 2 (the same
    or the other wrapping, on the world or halved to rank 0) equals model 2's own after the same steps, as does
    model 2's own round trip; then model 2 steps on."""
    settings = [(StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig(), (True, False)),
                (StateDictType.FULL_STATE_DICT, FullStateDictConfig(), FullOptimStateDictConfig(rank0_only=True),
                 (True, False)),
                (StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(), ShardedOptimStateDictConfig(), (False,))]
    for sd_type, sd_config, osd_config, halves in settings:
        for halve, alt in itertools.product(halves, (True, False)):
            rank0 = getattr(osd_config, "rank0_only", False)
            what = f"{sd_type.name} rank0_only={rank0} halve={halve} wrap_alt={alt}"
            m1, o1 = _pair(pg, use_orig_params=True, steps=3)
            FSDP.set_state_dict_type(m1, sd_type, sd_config, osd_config)
            osd1 = FSDP.optim_state_dict(m1, o1)
            group = pt_dist.new_group([0]) if halve else pg
            if halve and c.rank != 0:
                continue
            m2, o2 = _pair(group, "wrap_alt" if alt else "wrap", use_orig_params=True, steps=3)
            FSDP.set_state_dict_type(m2, sd_type, sd_config, osd_config)
            osd2 = FSDP.optim_state_dict(m2, o2, group=group)
            local = o2.state_dict()
            _same_flat_state(c, f"{what}: its own", FSDP.optim_state_dict_to_load(m2, o2, osd2, group=group), local)
            loaded = FSDP.optim_state_dict_to_load(m2, o2, osd1, group=group)
            _same_flat_state(c, f"{what}: model 1's", loaded, local)
            o2.load_state_dict(loaded)
            _train(m2, o2, 3, start=3)


def no_grad_cases(c, pg):
    """test_no_grad: a unit whose first layer is frozen and unfrozen in turn (use_orig_params=True); after each
    step the optimizer state, saved and loaded back directly, is the optimizer's own."""
    model = Nested()
    for p in model.block0.parameters():
        p.requires_grad_(False)
    fsdp = FSDP(model, process_group=pg, use_orig_params=True)
    opt = torch.optim.Adam(fsdp.parameters(), lr=1e-2)
    for i in range(5):
        for p in fsdp.block0.parameters():
            p.requires_grad_(i % 2 == 1)
        fsdp(torch.randn(4, 5, generator=torch.Generator().manual_seed(i))).sum().backward()
        opt.step()
        before = copy.deepcopy(opt.state_dict())
        FSDP.optim_state_dict_to_load(fsdp, opt, FSDP.optim_state_dict(fsdp, opt), load_directly=True)
        _same_flat_state(c, f"step {i}", opt.state_dict(), before)


def _same_named(c, what, a, b):
    """upstream ``_check_same_param_groups`` (no parameter keys) and ``_check_same_state`` (with them)."""
    c.true(f"{what}: keys {sorted(a['state'])} vs {sorted(b['state'])}", sorted(a["state"]) == sorted(b["state"]))
    for name, st in a["state"].items():
        for k, v in st.items():
            c.equal(f"{what}: {name}.{k}", _value(b["state"].get(name, {}).get(k)), _value(v), rtol=1e-5, atol=1e-7)
    strip = [[{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]] for sd in (a, b)]
    c.true(f"{what}: param_groups {strip}", strip[0] == strip[1])


def trec_cases(c, pg):
    """test_compatible_with_trec: a dense FSDP unit (use_orig_params=True) behind a rank-local sparse module
    (rank 0's ``sparse0``, rank 1's ``sparse1``, summed over the ranks), trained by an Adam and by a
    ``_NamedOptimizer`` alike: the same optimizer state dicts; the named one's, trained on, loaded back
    (``is_named_optimizer=True``), is the first again. The forward all-reduces a copy of the sparse output (the
    in-place collective would bump the version of what ReLU saved for backward)."""
    from torch.distributed.optim import _NamedOptimizer

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1 = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
            self.net2 = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
            self.net3 = nn.Linear(32, 64)
            self.net4 = nn.Sequential(nn.ReLU(), nn.Linear(64, 8))

        def forward(self, x):
            return self.net4(self.net3(self.net2(self.net1(x))))

    class FakeMP(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.dense = FSDP(Dense(), process_group=pg, use_orig_params=True)
            setattr(self, f"sparse{c.rank}", nn.Sequential(nn.Linear(8, 8), nn.ReLU()))

        def forward(self, x):
            sparse = getattr(self, f"sparse{c.rank}")(x).clone()
            pt_dist.all_reduce(sparse, group=pg)
            return self.dense(sparse)

    models = [FakeMP(), FakeMP()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (its "we pass in param_groups" warning)
        optims = [torch.optim.Adam(models[0].parameters(), lr=1e-2),
                  _NamedOptimizer(models[1].named_parameters(), torch.optim.Adam,
                                  [{"params": models[1].parameters()}], models[1], lr=1e-2)]
    batch = torch.rand(5, 8, generator=torch.Generator().manual_seed(0))
    osds = []
    for model, opt in zip(models, optims):
        for p in model.parameters():  # eagerly initialized states, as upstream
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt.step()
        model(batch).sum().backward()
        opt.step()
        osds.append(copy.deepcopy(FSDP.optim_state_dict(model, opt)))
    _same_named(c, "Adam vs _NamedOptimizer", osds[0], osds[1])
    for i in range(5):
        models[1](torch.rand(5, 8, generator=torch.Generator().manual_seed(1 + i))).sum().backward()
        optims[1].step()
    optims[1].load_state_dict(FSDP.optim_state_dict_to_load(models[1], optims[1], osds[1], is_named_optimizer=True))
    _same_named(c, "loaded back", osds[0], FSDP.optim_state_dict(models[1], optims[1]))


CASES = (orig_load_cases, no_grad_cases, trec_cases)


@upstream_cases.parametrize(CASES, expect=3)
def test_upstream_fsdp1_optim_state_use_orig_params_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180)
