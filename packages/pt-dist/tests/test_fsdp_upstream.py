"""torch's own FSDP tests, ported to pt_dist: test/distributed/fsdp/test_wrap.py (TestAutoWrap: the size-based
policy's wrapping, exclusions and forced leaves; TestFSDPWrap's main-API auto wrap and the already-wrapped
error), test/distributed/fsdp/test_fsdp_flatten_params.py (partial flattening, an empty module, numel and output
with and without shared parameters, the parameter norm after a step), test/distributed/fsdp/
test_fsdp_clip_grad_norm.py (the total norm and the clipped step against a local model),
test/distributed/fsdp/test_fsdp_ignored_modules.py, test/distributed/fsdp/test_fsdp_state_dict.py's
load-into-local-module case, and test/distributed/_composable/fsdp/test_fully_shard_training.py's
``test_train_parity_multi_group`` (against a replicated model: our DDP). Adapted: CPU, the wrap API
(``enable_wrap``/``auto_wrap``) replaced by ``_recursive_wrap``, world-1 cases on a world-1 group."""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist.fsdp import FullyShardedDataParallel as FSDP
from pt_dist.fsdp import ModuleWrapPolicy, size_based_auto_wrap_policy
from pt_dist.fsdp.wrap import _recursive_wrap
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import ddp_testutil as dutil  # noqa: E402
import upstream_cases  # noqa: E402


def _nested_sequential():
    return nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5), nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5)))


def _auto_wrap(module, policy, pg):
    """``auto_wrap(module)`` inside ``enable_wrap(wrapper_cls=FSDP, process_group=pg)``."""
    return _recursive_wrap(module, policy, FSDP, set(), set(), process_group=pg)[0]


def _transformer(shared=False):
    torch.manual_seed(0)
    module = nn.Transformer(d_model=32, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=128, dropout=0.1)
    module.register_buffer("dummy_buffer", torch.tensor(1.0))
    if shared:  # share the FFNs
        for enc, dec in zip(module.encoder.layers, module.decoder.layers):
            dec.linear1.weight, dec.linear2.weight = enc.linear1.weight, enc.linear2.weight
    return module


def _transformer_output(module):
    torch.manual_seed(1)
    src, tgt = torch.rand(20, 8, 32), torch.rand(10, 8, 32)
    return module(src, tgt)


def wrap_cases(c, pg):
    layer = FSDP(
        nn.Linear(5, 5),
        process_group=pg,
        auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=1),
    )
    c.true("test_wrap", isinstance(layer, FSDP) and layer.rank == pg.rank() and layer.world_size == pg.size())
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=40)
    for model in (
        FSDP(_nested_sequential(), process_group=pg, auto_wrap_policy=policy),  # test_auto_wrap_foo
        _auto_wrap(_nested_sequential(), lambda **kw: policy(**kw), pg),
    ):
        model = model if isinstance(model, FSDP) else FSDP(model, process_group=pg)
        c.true(
            "NestedSequentialModel.verify_model",
            isinstance(model.module[0], nn.Linear)
            and isinstance(model.module[1], nn.Linear)
            and isinstance(model.module[2], FSDP)
            and isinstance(model.module[2].module[0], nn.Linear)
            and isinstance(model.module[2].module[1], nn.Linear),
        )
    model = _auto_wrap(nn.ModuleList([nn.Linear(5, 5), nn.Linear(5, 5)]), policy, pg)  # preset_exclude_wrap
    c.true("exclude wrap", isinstance(model, nn.ModuleList) and all(isinstance(m, nn.Linear) for m in model))
    model = _auto_wrap(nn.ModuleList([nn.Linear(10, 10)]), policy, pg)  # exclude_wrap_include_children
    c.true("exclude wrap, children wrapped", isinstance(model, nn.ModuleList) and isinstance(model[0], FSDP))
    model = _auto_wrap(nn.Sequential(nn.Linear(10, 10), nn.MultiheadAttention(100, 1)), policy, pg)  # force_leaf
    c.true(
        "force leaf",
        isinstance(model.module[0], FSDP)
        and isinstance(model.module[1], nn.MultiheadAttention)
        and isinstance(model.module[1].out_proj, nn.Linear),
    )
    custom = functools.partial(
        size_based_auto_wrap_policy,
        min_num_params=40,
        force_leaf_modules=size_based_auto_wrap_policy.FORCE_LEAF_MODULES.union({nn.Linear}),
    )
    model = _auto_wrap(nn.Sequential(nn.Linear(10, 10), nn.ModuleList([nn.Linear(10, 10)])), custom, pg)
    c.true(
        "force leaf custom",
        isinstance(model, FSDP)
        and isinstance(model.module[0], nn.Linear)
        and isinstance(model.module[1], nn.ModuleList),
    )

    class Nested(nn.Module):  # test_main_api_auto_wrap
        def __init__(self):
            super().__init__()
            self.nested_lin = nn.Linear(1, 1, bias=False)

        def forward(self, x):
            return self.nested_lin(x)

    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2, self.lin3 = (nn.Linear(1, 1, bias=False) for _ in range(3))
            self.lin4 = Nested()

        def forward(self, x):
            return self.lin4(self.lin3(self.lin2(self.lin1(x))))

    model = MyModel()
    wrapped = FSDP(
        model, process_group=pg, auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=0)
    )
    m = wrapped.module
    c.true(
        "every module wrapped",
        all(isinstance(x, FSDP) for x in (wrapped, m.lin1, m.lin2, m.lin3, m.lin4, m.lin4.module.nested_lin)),
    )
    optim = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    for _ in range(6):
        optim.zero_grad()
        wrapped(torch.ones(1)).sum().backward()
        optim.step()
    with pytest.raises(ValueError, match="requires modules to not already have FSDP applied"):  # error_auto_wrap
        FSDP(
            nn.Sequential(nn.Linear(1, 1), FSDP(nn.Linear(1, 1), process_group=pg)),
            process_group=pg,
            auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=0),
        )


def flatten_cases(c, pg):
    """test_fsdp_flatten_params.py, on a world-1 group (upstream's world size 1)."""
    solo = pt_dist.new_group([c.rank], use_local_synchronization=True)
    for half in (False, True):  # test_partial_flattening
        module = _transformer()
        if half:
            module = module.half()
        numel = sum(p.numel() for p in module.parameters())
        enc1, dec0 = list(module.encoder.layers[1].parameters()), list(module.decoder.layers[0].parameters())
        module.encoder.layers[1] = FSDP(module.encoder.layers[1], process_group=solo)
        module.decoder.layers[0] = FSDP(module.decoder.layers[0], process_group=solo)
        flats = [module.encoder.layers[1]._flat_param, module.decoder.layers[0]._flat_param]
        c.true(
            "partial flattening numel",
            sum(f.numel() for f in flats) == sum(p.numel() for p in enc1 + dec0)
            and sum(p.numel() for p in module.parameters()) == numel,
        )
        c.true(
            "one flat parameter per wrapped layer",
            len(list(module.encoder.layers[1].parameters())) == 1
            and len(list(module.decoder.layers[0].parameters())) == 1,
        )
        c.true(
            "the others untouched",
            len(list(module.encoder.layers[0].parameters())) == len(enc1)
            and len(list(module.decoder.layers[1].parameters())) == len(dec0),
        )
        new_dtype = torch.float32 if half else torch.float16
        module = module.to(dtype=new_dtype)
        c.true("module.to() converts flat parameters", all(f.dtype == new_dtype for f in flats))

    class EmptyModule(nn.Module):  # test_empty_module
        def forward(self, x):
            return x + 1

    empty = FSDP(EmptyModule(), process_group=solo)
    c.true(
        "empty module",
        len(list(empty.parameters())) == 0
        and empty._flat_param is None
        and torch.equal(empty(torch.ones(1)), torch.full((1,), 2.0)),
    )
    for shared in (False, True):  # test_numel_with(out)_shared_params, test_output_with(out)_shared_params
        module = _transformer(shared)
        c.true(
            f"numel shared={shared}",
            FSDP(copy.deepcopy(module), process_group=solo)._handle.numel
            == sum(p.numel() for p in module.parameters()),
        )
        ref = _transformer_output(module)
        c.equal(f"output shared={shared}", _transformer_output(FSDP(module, process_group=solo)), ref, 1e-5, 1e-6)

    def pnorm_after_step(module):  # test_pnorm_after_step_with_shared_params
        optim = torch.optim.SGD(module.parameters(), lr=0.01)
        _transformer_output(module).sum().backward()
        optim.step()
        return torch.norm(torch.stack([p.detach().norm() for p in module.parameters()]))

    c.equal(
        "pnorm after a step, shared parameters",
        pnorm_after_step(FSDP(_transformer(True), process_group=solo)),
        pnorm_after_step(_transformer(True)),
        1e-5,
        1e-6,
    )


def clip_grad_norm_cases(c, pg):
    for norm_type in (2.0, float("inf")):
        torch.manual_seed(0)
        local = dutil.stack()
        fsdp = FSDP(copy.deepcopy(local), process_group=pg, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}))
        xs, ys = dutil.batches(c.world_size, 0)
        (sum(dutil.mse(local, xs[r], ys[r], r) for r in range(c.world_size)) / c.world_size).backward()
        dutil.mse(fsdp, xs[c.rank], ys[c.rank], c.rank).backward()
        ref = torch.nn.utils.clip_grad_norm_(local.parameters(), 0.05, norm_type)
        total = fsdp.clip_grad_norm_(0.05, norm_type)
        c.equal(f"total norm ({norm_type})", total, ref.float(), 1e-5, 1e-7)
        for opt in (torch.optim.SGD(local.parameters(), lr=1.0), torch.optim.SGD(fsdp.parameters(), lr=1.0)):
            opt.step()
        full = fsdp.full_state_dict()
        for name, p in local.state_dict().items():
            c.equal(f"clipped step {name}", full[name], p, 1e-5, 1e-6)


def ignored_modules_cases(c, pg):
    torch.manual_seed(0)
    model = dutil.stack()
    ignored = list(model[1].parameters())
    fsdp = FSDP(model, process_group=pg, ignored_modules=[model[1]])
    params = list(fsdp.parameters())
    c.true(
        "ignored parameters are not flattened",
        all(any(p is q for q in params) for p in ignored) and len(params) == 1 + len(ignored),
    )
    before = [p.detach().clone() for p in ignored]
    optim = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    dutil.mse(fsdp, torch.randn(4, 6), torch.randn(4, 3), c.rank).backward()
    c.true("an ignored module's gradients stay this rank's own", all(p.grad is not None for p in ignored))
    optim.step()
    c.true("and its parameters step", all(not torch.equal(a, p) for a, p in zip(before, ignored)))


def load_into_local_module(c, pg):
    torch.manual_seed(0)
    fsdp = FSDP(dutil.stack(), process_group=pg, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}))
    dutil.mse(fsdp, torch.randn(4, 6), torch.randn(4, 3), c.rank).backward()
    torch.optim.SGD(fsdp.parameters(), lr=0.1).step()
    local = dutil.stack()
    local.load_state_dict(fsdp.full_state_dict())
    x = torch.randn(3, 6)
    with torch.no_grad():
        c.equal("test_state_dict_load_into_local_module", local(x), fsdp(x), 1e-6, 1e-7)


def train_parity_multi_group(c, pg):
    """FSDP2's test: fully sharded per block vs a replicated reference, 10 iterations of Adam."""
    torch.manual_seed(42)
    model = dutil.stack(blocks=3)
    ref = pt_dist.DistributedDataParallel(copy.deepcopy(model), process_group=pg)
    fsdp = FSDP(model, process_group=pg, auto_wrap_policy=ModuleWrapPolicy({dutil.Block}))
    optims = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (ref, fsdp)]
    torch.manual_seed(42 + c.rank + 1)
    for _ in range(10):
        x, y = torch.randn(4, 6), torch.randn(4, 3)
        losses = []
        for m, opt in zip((ref, fsdp), optims):
            loss = dutil.mse(m, x, y, c.rank)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        c.equal("test_train_parity_multi_group loss", losses[1], losses[0], 1e-5, 1e-6)


CASES = (wrap_cases, flatten_cases, clip_grad_norm_cases, ignored_modules_cases, load_into_local_module,
         train_parity_multi_group)


@upstream_cases.parametrize(CASES, expect=6, backends=("tcp", "shm", "gloo"))
def test_upstream_fsdp_cases(backend, case, request):
    upstream_cases.check(request, world=2, timeout=240)
