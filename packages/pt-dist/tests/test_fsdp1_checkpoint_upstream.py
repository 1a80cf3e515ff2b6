"""torch's test/distributed/fsdp/test_fsdp_checkpoint.py (TestFSDPCheckpoint, TestFSDPCheckpointSubmodule) and
test_fsdp_state_dict.py's ``test_fsdp_state_dict_with_activation_checkpoint``, ported to pt_dist's FSDP1 on CPU,
world size 2, tcp and shm.

- ``test_checkpoint_fsdp_wrapping``: ``checkpoint_wrapper`` / ``offload_wrapper`` around a Sequential of FSDP
  layers, FSDP around checkpointed layers, and plain FSDP layers: equal losses, outputs and gradients over two
  iterations; the offload wrapper really saves on CPU (upstream's patched ``save_on_cpu``).
- ``test_basic_checkpoint_end_to_end``: ``FSDP(seq)``, ``wrapper(FSDP(seq))``, ``FSDP(wrapper(seq))`` and
  ``checkpoint(FSDP(seq), use_reentrant=True)`` (under ``save_on_cpu`` when offloading) over six iterations.
- ``test_checkpoint_submodule``: submodules calling ``torch.utils.checkpoint`` (non-reentrant, as upstream)
  inside ``NO_SHARD`` units: the gradients of the model without checkpointing.
- ``test_fsdp_state_dict_with_activation_checkpoint``: a simple and a nested FSDP model, checkpoint-wrapped in
  the source, the destination, both, or by ``apply_activation_checkpointing`` after wrapping; FULL (``rank0_only``
  + ``offload_to_cpu`` on/off, rank 0's broadcast) and SHARDED (gathered); loaded strictly into a zeroed model.

The first two run with ``cpu_offload`` ``CPUOffload(offload_params=False)`` and ``True`` (on the CPU, where the
shards already live); their ``use_orig_params=True`` halves are left out (pt_dist's FSDP1 refuses it). Losses,
outputs and gradients compare with ``assertEqual``'s float tolerances, as upstream's (with the offload wrapper they
differ in the last bits); the state-dict loads compare exactly.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import sys
from functools import partial
from pathlib import Path

import pt_dist
import torch
import torch.distributed.algorithms._checkpoint.checkpoint_wrapper as cw
from pt_dist.fsdp import (
    CPUOffload,
    FullStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import upstream_cases  # noqa: E402

_saved_on_cpu = []


@contextlib.contextmanager
def _patched_save_on_cpu():
    """upstream's patch_save_on_cpu: records that the offload wrapper went through save_on_cpu."""
    orig = cw.save_on_cpu

    def patched(*args, **kwargs):
        _saved_on_cpu.append(1)
        return orig(*args, **kwargs)

    cw.save_on_cpu = patched
    try:
        yield patched
    finally:
        cw.save_on_cpu = orig


class Sequential3(nn.Module):
    """upstream's SequentialModule: three Linear(3, 3), each optionally checkpointed and/or its own unit."""

    def __init__(self, pg=None, checkpoint_layer=False, offload=False, wrap_fsdp=False, cpu_offload=None,
                 use_orig_params=False):
        super().__init__()
        torch.manual_seed(0)
        layers = [nn.Linear(3, 3) for _ in range(3)]
        if checkpoint_layer:
            layers = [(cw.offload_wrapper if offload else cw.checkpoint_wrapper)(m) for m in layers]
        self.ffn = nn.Sequential(*(FSDP(m, process_group=pg, cpu_offload=cpu_offload, use_orig_params=use_orig_params)
                                   if wrap_fsdp else m for m in layers))

    def forward(self, x):
        return self.ffn(x)


def _parity(c, what, losses, outputs, models):
    for i, (loss, out) in enumerate(zip(losses[1:], outputs[1:]), 1):
        c.equal(f"{what}: model {i} loss", loss, losses[0], rtol=1.3e-6, atol=1e-5)
        c.equal(f"{what}: model {i} output", out, outputs[0], rtol=1.3e-6, atol=1e-5)
    ref = [p.grad for p in models[0].parameters()]
    for i, m in enumerate(models[1:], 1):
        grads = [p.grad for p in m.parameters()]
        c.true(f"{what}: model {i} has {len(grads)} gradients, the reference {len(ref)}", len(grads) == len(ref))
        for a, b in zip(grads, ref):
            c.equal(f"{what}: model {i} gradient", a, b, rtol=1.3e-6, atol=1e-5)


def fsdp_wrapping_cases(c, pg):
    """test_checkpoint_fsdp_wrapping."""
    for offload, params_off, orig in itertools.product((False, True), repeat=3):
        wrapper = cw.offload_wrapper if offload else cw.checkpoint_wrapper
        kw = {"cpu_offload": CPUOffload(offload_params=params_off), "use_orig_params": orig}
        outer = wrapper(Sequential3(pg, wrap_fsdp=True, **kw))
        inner = Sequential3(pg, checkpoint_layer=True, offload=offload, wrap_fsdp=True, **kw)
        baseline = Sequential3(pg, wrap_fsdp=True, **kw)
        x = torch.randn(10, 3, generator=torch.Generator().manual_seed(7), requires_grad=True)
        models = [outer, inner, baseline]
        with _patched_save_on_cpu():
            for i in range(2):
                losses, outputs = [], []
                for m in models:
                    check = m is not baseline and i == 0 and offload
                    _saved_on_cpu.clear()
                    out = m(x)
                    if check:
                        c.true(f"offload: save_on_cpu used by model {models.index(m)}", bool(_saved_on_cpu))
                    loss = out.sum()
                    loss.backward()
                    losses.append(loss.detach())
                    outputs.append(out.detach())
                _parity(c, f"fsdp wrapping offload={offload} cpu_offload={params_off} use_orig_params={orig} iter {i}",
                        losses, outputs, models[::-1])


def end_to_end_cases(c, pg):
    """test_basic_checkpoint_end_to_end."""
    for offload, params_off, orig in itertools.product((False, True), repeat=3):
        wrapper = cw.offload_wrapper if offload else cw.checkpoint_wrapper
        kw = {"process_group": pg, "cpu_offload": CPUOffload(offload_params=params_off), "use_orig_params": orig}
        with _patched_save_on_cpu() as patched:
            seq = Sequential3()
            fsdp_only = FSDP(copy.deepcopy(seq), **kw)
            checkpointed = wrapper(FSDP(copy.deepcopy(seq), **kw))
            wrapped_checkpoint = FSDP(wrapper(copy.deepcopy(seq)), **kw)
            call_checkpoint = FSDP(copy.deepcopy(seq), **kw)
            x = torch.randn(10, 3, generator=torch.Generator().manual_seed(8), requires_grad=True)
            models = [fsdp_only, checkpointed, wrapped_checkpoint, call_checkpoint]
            for i in range(6):
                losses, outputs = [], []
                for m in models:
                    _saved_on_cpu.clear()
                    if m is call_checkpoint:
                        with patched(pin_memory=True) if offload else contextlib.nullcontext():
                            out = checkpoint(m, x, use_reentrant=True)
                    else:
                        out = m(x)
                    if m is not fsdp_only and i == 0 and offload:
                        c.true(f"end to end: save_on_cpu used by model {models.index(m)}", bool(_saved_on_cpu))
                    loss = out.sum()
                    loss.backward()
                    losses.append(loss.detach())
                    outputs.append(out.detach())
                _parity(c, f"end to end offload={offload} cpu_offload={params_off} use_orig_params={orig} iter {i}",
                        losses, outputs, models)


class _CheckpointModule(nn.Module):
    def __init__(self, use_checkpoint=False):
        super().__init__()
        self.seq = nn.Sequential(*[nn.Linear(20, 20) for _ in range(4)])
        self.checkpoint = use_checkpoint

    def forward(self, x):
        return checkpoint(self.seq, x, use_reentrant=False) if self.checkpoint else self.seq(x)


class _WithCheckpointSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.s1, self.s2 = nn.Linear(20, 20), _CheckpointModule(), _CheckpointModule()
        self.l2 = nn.Linear(20, 20)

    def forward(self, x):
        return self.l2(torch.relu(self.s2(self.s1(self.l1(x)))))


class _SubmoduleModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = nn.Linear(20, 20), nn.Linear(20, 20)
        self.checkpoint1, self.checkpoint2 = _WithCheckpointSubmodule(), _WithCheckpointSubmodule()

    def forward(self, x):
        return self.l2(torch.relu(self.checkpoint2(self.checkpoint1(self.l1(x)))))


def submodule_cases(c, pg):
    """test_checkpoint_submodule (use_reentrant=False, as upstream)."""
    model = _SubmoduleModel()
    model_ac = copy.deepcopy(model)
    for m in model_ac.modules():
        if isinstance(m, _CheckpointModule):
            m.checkpoint = True
    for m in (model, model_ac):
        for name in ("checkpoint1", "checkpoint2"):
            setattr(m, name, FSDP(getattr(m, name), process_group=pg, sharding_strategy=ShardingStrategy.NO_SHARD))
    x = torch.randn(2, 20, generator=torch.Generator().manual_seed(c.rank))
    model(x).sum().backward()
    model_ac(x).sum().backward()
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), model_ac.named_parameters()):
        c.true(f"submodule: names {n1} {n2}", n1 == n2)
        c.equal(f"submodule: gradient {n1}", p2.grad, p1.grad, rtol=1e-5, atol=1e-7)


def _simple(pg, checkpoint_wrap=False):
    torch.manual_seed(0)
    lin = nn.Linear(10, 10)
    return FSDP(cw.checkpoint_wrapper(lin) if checkpoint_wrap else lin, process_group=pg)


def _simple_nested(pg, checkpoint_wrap=False):
    torch.manual_seed(0)
    lin1, lin2 = nn.Linear(10, 10), nn.Linear(10, 10)
    if checkpoint_wrap:
        lin1, lin2 = cw.checkpoint_wrapper(lin1), cw.checkpoint_wrapper(lin2)
    seq = nn.Sequential(FSDP(lin1, process_group=pg), lin2)
    return FSDP(cw.checkpoint_wrapper(seq) if checkpoint_wrap else seq, process_group=pg)


def _ac_on_linears(model):
    cw.apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(
        cw.checkpoint_wrapper, checkpoint_impl=cw.CheckpointImpl.NO_REENTRANT), check_fn=lambda m: isinstance(
        m, nn.Linear))


def _values(model):
    with FSDP.summon_full_params(model, writeback=False):
        return [p.detach().clone() for p in model.parameters()]


def state_dict_cases(c, pg):
    """test_fsdp_state_dict_with_activation_checkpoint."""
    configs = [(StateDictType.FULL_STATE_DICT, False), (StateDictType.FULL_STATE_DICT, True),
               (StateDictType.SHARDED_STATE_DICT, False)]
    for (kind, rank0), where in ((k, w) for k in configs for w in
                                 ("source", "dest", "both", "source_after_wrap", "both_after_wrap")):
        for build in (_simple, _simple_nested):
            what = f"{kind.name} rank0_only={rank0} {where} {build.__name__}"
            model = build(pg, checkpoint_wrap=where in ("source", "both"))
            if where in ("source_after_wrap", "both_after_wrap"):
                _ac_on_linears(model)
            config = (FullStateDictConfig(rank0_only=rank0, offload_to_cpu=rank0)
                      if kind is StateDictType.FULL_STATE_DICT else ShardedStateDictConfig())
            with FSDP.state_dict_type(model, kind, config):
                sd = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
            if rank0:
                c.true(f"{what}: empty off rank 0", bool(sd) == (c.rank == 0))
                box = [sd]
                pt_dist.broadcast_object_list(box, src=0)
                sd = box[0]
            new = build(pg, checkpoint_wrap=where in ("dest", "both"))
            if where == "both_after_wrap":
                _ac_on_linears(new)
            with torch.no_grad():
                for p in new.parameters():
                    p.zero_()
            c.true(f"{what}: zeroed differs", any(not torch.equal(a, b) for a, b in zip(_values(new), _values(model))))
            new.load_state_dict(sd, strict=True)
            for a, b in zip(_values(new), _values(model)):
                c.equal(f"{what}: loaded", a, b, rtol=0, atol=0)


CASES = (fsdp_wrapping_cases, end_to_end_cases, submodule_cases, state_dict_cases)


@upstream_cases.parametrize(CASES, expect=4)
def test_upstream_fsdp1_checkpoint_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=180)
