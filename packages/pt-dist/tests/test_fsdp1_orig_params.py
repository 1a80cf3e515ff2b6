"""FSDP1 with ``use_orig_params=True`` against torch's own FSDP1 with it, trained alike in the same ranks (torch's
runs on CPU with ``device_id=cpu`` over a gloo group), after torch's test/distributed/fsdp/test_fsdp_use_orig_params.py
(``TestFSDPUseOrigParamsUnshardReshard``, ``..ParamAccess``, ``..WriteBack``, ``..FQNs``): the same parameter names,
each rank's same sharded views (1-D runs of its flat shard, 16-byte aligned as torch's), values and gradients after
steps with per-parameter AdamW groups and a frozen parameter inside a unit, ``zero_grad`` between forward and
backward, gradients accumulated over two backwards; ``clip_grad_norm_`` after a gradient replaced by hand; the
full and sharded state dicts; ``summon_full_params``
with ``with_grads``; the optimizer state dicts (full and sharded) and their round trip; writeback of
``p.data = ...`` and ``p.grad = ...``."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.fsdp import ShardingStrategy, StateDictType
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from test_fully_shard_common import two_worlds  # noqa: E402


def _net():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Sequential(nn.Linear(7, 5), nn.Tanh()), nn.Linear(5, 3))
    net[0].bias.requires_grad_(False)  # frozen, in the root's unit with trainable ones
    return net


def _wrap(fsdp, strategy, **kw):
    net = _net()
    net[2] = fsdp(net[2], use_orig_params=True, sharding_strategy=strategy, **kw)
    return fsdp(net, use_orig_params=True, sharding_strategy=strategy, **kw)


def _optim(model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight") and p.requires_grad]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0,
                                                                       "lr": 3e-2}], lr=1e-2)


def _batch(rank, i):
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(100 * rank + i))


def _train(model, opt, rank, start=0):
    """Three steps: zero_grad first; zero_grad between forward and backward; two backwards summed. ``rank``
    None: both ranks' batches at once (the plain model's share of the average)."""
    def batch(i):
        return _batch(rank, i) if rank is not None else torch.cat([_batch(r, i) for r in range(2)])

    opt.zero_grad()
    model(batch(start)).square().mean().backward()
    opt.step()
    out = model(batch(start + 1)).square().mean()
    opt.zero_grad()
    out.backward()
    opt.step()
    for j in (2, 3):
        model(batch(start + j)).square().mean().backward()
    opt.step()


def _reference():
    """The plain model trained alike on both ranks' batches together (FSDP averages the two ranks' means):
    its parameters and its optimizer state keyed by parameter name."""
    net = _net()
    opt = _optim(net)
    _train(net, opt, None)
    names = [n for n, p in net.named_parameters() if p.requires_grad]
    order = [n for n in names if n.endswith("weight")] + [n for n in names if not n.endswith("weight")]
    state = {order[i]: st for i, st in opt.state_dict()["state"].items()}
    return {n: p.detach() for n, p in net.named_parameters()}, state


def _params(model):
    return {n: (p.detach().clone(), None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _local(v):
    if hasattr(v, "local_tensor"):
        return v.local_tensor().clone()
    if hasattr(v, "to_local"):
        return v.to_local().clone()
    return v.clone() if torch.is_tensor(v) else v


def _both(rank, world, backend, strategy):
    with two_worlds(rank, world, f"uop{strategy}", backend):
        return _both_body(rank, strategy)


def _both_body(rank, strategy):
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
    from torch.distributed.fsdp import ShardingStrategy as TorchStrategy
    from torch.distributed.fsdp import StateDictType as TorchType

    theirs = _wrap(TorchFSDP, getattr(TorchStrategy, strategy), device_id=torch.device("cpu"))
    ours = _wrap(FSDP, getattr(ShardingStrategy, strategy))
    out = {"names": [[(n, tuple(p.shape), p.requires_grad) for n, p in m.named_parameters()]
                     for m in (theirs, ours)]}
    opts = [_optim(m) for m in (theirs, ours)]
    for m, o in zip((theirs, ours), opts):
        _train(m, o, rank)
    out["params"] = [_params(m) for m in (theirs, ours)]
    # clip_grad_norm_ after one original's gradient was replaced by hand (torch clips the originals' gradients)
    for m in (theirs, ours):
        p = dict(m.named_parameters())["_fsdp_wrapped_module.3.weight"]
        if p.grad is not None:
            p.grad = p.grad * 3
    out["norms"] = [m.clip_grad_norm_(0.05) for m in (theirs, ours)]
    out["clipped"] = [_params(m) for m in (theirs, ours)]
    out["full"] = [m.state_dict() for m in (theirs, ours)]
    for m in (theirs, ours):
        with type(m).summon_full_params(m, with_grads=True):
            out.setdefault("summoned", []).append(_params(m))
    out["after summon"] = _params(ours)
    out["optim"] = [TorchFSDP.optim_state_dict(theirs, opts[0]), FSDP.optim_state_dict(ours, opts[1])]
    with TorchFSDP.state_dict_type(theirs, TorchType.SHARDED_STATE_DICT):
        sh_t = (theirs.state_dict(), TorchFSDP.optim_state_dict(theirs, opts[0]))
    with FSDP.state_dict_type(ours, StateDictType.SHARDED_STATE_DICT):
        sh_o = (ours.state_dict(), FSDP.optim_state_dict(ours, opts[1]))
    out["sharded"] = [({k: _local(v) for k, v in sd.items()},
                       {n: {k: _local(v) for k, v in st.items()} for n, st in osd["state"].items()})
                      for sd, osd in (sh_t, sh_o)]
    # the round trip: a fresh model and optimizer take what was saved, and the next steps equal the run's
    fresh = _wrap(FSDP, getattr(ShardingStrategy, strategy))
    fresh.load_state_dict(copy.deepcopy(out["full"][1]))
    fresh_opt = _optim(fresh)
    fresh_opt.load_state_dict(FSDP.optim_state_dict_to_load(fresh, fresh_opt, copy.deepcopy(out["optim"][1])))
    with FSDP.state_dict_type(fresh, StateDictType.SHARDED_STATE_DICT):
        sharded_opt = _optim(fresh)
        sharded_opt.load_state_dict(FSDP.optim_state_dict_to_load(fresh, sharded_opt, sh_o[1]))
    out["sharded optim round trip"] = _same_state(sharded_opt, fresh_opt)
    for m, o in ((ours, opts[1]), (fresh, fresh_opt), (theirs, opts[0])):
        _train(m, o, rank, start=10)
    out["resumed"] = [_params(m) for m in (theirs, ours, fresh)]
    return out


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sorted(sa) == sorted(sb) and all(torch.equal(sa[i][k], v) for i, st in sb.items() for k, v in st.items())


def _close(got: dict, want: dict, what: str):
    assert sorted(got) == sorted(want), what
    for n, (p, g) in want.items():
        torch.testing.assert_close(got[n][0], p, rtol=1e-5, atol=1e-6, msg=f"{what}: {n}")
        assert (got[n][1] is None) == (g is None), f"{what}: {n} grad {got[n][1]} vs torch's {g}"
        if g is not None:
            torch.testing.assert_close(got[n][1], g, rtol=1e-5, atol=1e-6, msg=f"{what}: {n} grad")


@pytest.mark.parametrize(("backend", "strategy"), [("tcp", "FULL_SHARD"), ("shm", "FULL_SHARD"),
                                                   ("tcp", "SHARD_GRAD_OP"), ("tcp", "NO_SHARD")])
def test_use_orig_params_trains_and_saves_as_torchs(backend, strategy):
    ref_params, ref_state = _reference()
    for rank, out in enumerate(run_ranks(_both, 2, backend, strategy, backend=None, timeout=240)):
        theirs, ours = out["names"]
        assert ours == theirs, (rank, ours, theirs)  # names, each rank's sharded shapes, requires_grad
        _close(out["params"][1], out["params"][0], f"rank {rank} trained")
        torch.testing.assert_close(out["norms"][1], out["norms"][0], rtol=1e-5, atol=1e-6)
        assert out["norms"][0] > 0.05  # (so the clip did scale)
        _close(out["clipped"][1], out["clipped"][0], f"rank {rank} clip_grad_norm_")
        full_t, full_o = out["full"]
        assert sorted(full_o) == sorted(full_t) == sorted(ref_params)
        for k, v in full_t.items():
            torch.testing.assert_close(full_o[k], v, rtol=1e-5, atol=1e-6, msg=k)
            torch.testing.assert_close(full_o[k], ref_params[k], rtol=1e-4, atol=1e-6, msg=f"{k} vs the plain run")
        _close(out["summoned"][1], out["summoned"][0], f"rank {rank} summon_full_params(with_grads=True)")
        _close(out["after summon"], out["clipped"][1], f"rank {rank} after the summon")
        # torch's own full optimizer state is wrong here: on CPU every per-element state of a use_orig_params unit
        # is a view of one gathered buffer that _allgather_orig_param_states reuses per state, so exp_avg comes
        # back as exp_avg_sq (a GPU's copy to CPU hides it), and under NO_SHARD its step is the ranks' sum (6 for
        # 3 steps); keys (and step, sharded) from torch, values from the plain run
        osd_t, osd_o = out["optim"]
        assert sorted(osd_o["state"]) == sorted(osd_t["state"]) == sorted(ref_state)
        for name, st in ref_state.items():
            assert sorted(st) == sorted(osd_o["state"][name]) == sorted(osd_t["state"][name]), name
            if strategy != "NO_SHARD":
                torch.testing.assert_close(osd_o["state"][name]["step"], osd_t["state"][name]["step"])
            for k, v in st.items():
                torch.testing.assert_close(osd_o["state"][name][k], v, rtol=1e-4, atol=1e-7, msg=f"{name} {k}")
        assert [g["params"] for g in osd_o["param_groups"]] == [g["params"] for g in osd_t["param_groups"]]
        (sd_t, sosd_t), (sd_o, sosd_o) = out["sharded"]
        assert sorted(sd_o) == sorted(sd_t) and sorted(sosd_o) == sorted(sosd_t)
        for k, v in sd_t.items():
            torch.testing.assert_close(sd_o[k], v, rtol=1e-5, atol=1e-6, msg=f"sharded {k}")
        for name, st in sosd_t.items():
            for k, v in st.items():
                torch.testing.assert_close(sosd_o[name][k], v, rtol=1e-5, atol=1e-6, msg=f"sharded {name} {k}")
        assert out["sharded optim round trip"]
        r_t, r_o, r_fresh = out["resumed"]
        _close(r_o, r_t, f"rank {rank} resumed")
        _close(r_fresh, r_o, f"rank {rank} reloaded")
