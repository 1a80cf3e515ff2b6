"""ZeRO-3's step trace and parameter reuse side by side with real DeepSpeed (CPU, gloo): same model, same JSON.

DeepSpeed's ``PartitionedParameterCoordinator`` records one trace per step, the forward's module fetches then
the backward's (an activation-checkpoint recompute runs in backward, so it is recorded there), and keeps a
parameter gathered when the trace uses it again within ``stage3_max_reuse_distance`` elements, across the
forward/backward boundary. Upstream's counterpart is ``tests/unit/runtime/zero/test_zero_context.py`` and
``test_zero.py``'s prefetch cases; here the traces and the all-gather bytes are compared with DeepSpeed's own.
"""

import importlib.util
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS, MICRO, WIDTH = 4, 2, 16


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(x)))


class Net(torch.nn.Module):
    """Embedding, three residual blocks (each checkpointed in ``torch`` / ``own`` modes), head."""

    def __init__(self, mode: str):
        super().__init__()
        self.embed = torch.nn.Linear(lib.IN, WIDTH)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(WIDTH, lib.OUT)
        self.mode, self.own_checkpoint = mode, None

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            if self.mode == "torch":
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=True)
            elif self.mode == "own":  # the framework's own: deepspeed.checkpointing / ds_zero.checkpointing
                x = self.own_checkpoint(b, x)
            else:
                x = b(x)
        return self.head(x)


def _config(world: int, **zero) -> dict:
    cfg = lib.base_config(3, world, micro=MICRO)
    cfg["optimizer"]["params"]["weight_decay"] = 0.0
    cfg["gradient_clipping"] = 0.0  # DeepSpeed's default is 1.0
    cfg["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0,
                                "stage3_prefetch_bucket_size": 600, **zero}
    return cfg


CASES = {  # name -> (checkpoint mode, zero_optimization additions)
    "plain": ("none", {}),
    "torch_ckpt": ("torch", {}),
    "own_ckpt": ("own", {}),
    "plain_no_reuse": ("none", {"stage3_max_reuse_distance": 0}),
    "torch_ckpt_no_reuse": ("torch", {"stage3_max_reuse_distance": 0}),
    "plain_no_reuse_no_prefetch": ("none", {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0}),
}


def _train(impl, mode, cfg, rank, world, counter):
    if impl == "deepspeed":
        import deepspeed

        init, own = deepspeed.initialize, deepspeed.checkpointing
    else:
        import ds_zero
        import ds_zero.checkpointing as own

        init = ds_zero.initialize
    torch.manual_seed(0)
    model = Net(mode)
    model.own_checkpoint = own.checkpoint
    names = {id(m): n for n, m in model.named_modules()}
    engine, *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
    if impl == "deepspeed":
        coord = engine.optimizer.parameter_offload.get_param_coordinator()
        trace = lambda: [names[id(m)] for m in coord._PartitionedParameterCoordinator__submodule_order]  # noqa: E731
    else:
        coord = engine.optimizer.coordinator
        trace = lambda: [names[id(m)] for m in coord.trace["fwd"] + coord.trace["bwd"]]  # noqa: E731
    x, y = lib.make_data(STEPS, MICRO * world)
    out = {"traces": [], "gathered": [], "gather_sizes": [], "losses": []}
    for s in range(STEPS):
        counter.reset()
        counter.enabled = True
        out["losses"] += lib.train_ds(engine, x[s:s + 1], y[s:s + 1], rank, world, MICRO, 1)
        counter.enabled = False
        op = counter.totals()["by_op"].get("all_gather_into_tensor", {})
        out["gathered"].append(op.get("payload_bytes", 0))
        out["gather_sizes"].append(op.get("sizes", {}))  # bytes of each all-gather -> how many
        out["traces"].append(trace())
    if impl == "ds_zero":
        out["fwd_len"], out["recordings"] = len(coord.trace["fwd"]), getattr(coord, "recordings", None)
        engine.destroy()
    return out


def _side_by_side(rank, world):
    with lib.one_thread():
        import deepspeed.ops
        from harness.pipelines.compare.comm import CommCounter

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        counter = CommCounter(world)
        counter.enabled = False
        results = {}
        # Entered before DeepSpeed builds its comm backend, which keeps the all-gather function it finds.
        with counter:
            for name, (mode, zero) in CASES.items():
                for impl in ("deepspeed", "ds_zero"):
                    results[name, impl] = _train(impl, mode, _config(world, **zero), rank, world, counter)
        return results


@pytest.fixture(scope="module")
def per_rank():
    return run_ranks(_side_by_side, 2, timeout=600, fresh=True)


@pytest.fixture(scope="module")
def results(per_rank):
    return per_rank[0]


def _psi_bytes(world: int = 2) -> int:
    return sum(-(-p.numel() // world) * world * 4 for p in Net("none").parameters())


@pytest.mark.parametrize("name", CASES)
def test_trace_is_deepspeeds_and_stays_the_same_every_step(results, name):
    ours, theirs = results[name, "ds_zero"], results[name, "deepspeed"]
    # DeepSpeed records during the first step and completes the trace at the second step's start.
    assert theirs["traces"][1] == theirs["traces"][-1] and len(theirs["traces"][-1]) > 20
    assert all(t == ours["traces"][0] for t in ours["traces"]), "the trace changed from step to step"
    assert ours["traces"][-1] == theirs["traces"][-1]
    assert ours["recordings"] == 1  # recorded once, never invalidated


def test_recompute_is_recorded_in_backward_not_in_forward(results):
    plain, ckpt = results["plain", "ds_zero"], results["torch_ckpt", "ds_zero"]
    fwd = plain["traces"][-1][:plain["fwd_len"]]
    assert ckpt["fwd_len"] == plain["fwd_len"] == len(fwd) == 12  # root, embed, 3 x (block, fc1, fc2), head
    assert ckpt["traces"][-1][:ckpt["fwd_len"]] == fwd
    # 3 blocks x (block, fc1, fc2) recomputed inside backward, on top of the plain backward.
    assert len(ckpt["traces"][-1]) - len(plain["traces"][-1]) == 9


@pytest.mark.parametrize("name", CASES)
def test_all_gather_bytes_per_step_equal_deepspeeds(results, name):
    ours, theirs = results[name, "ds_zero"], results[name, "deepspeed"]
    assert ours["gathered"][1:] == theirs["gathered"][1:]
    assert ours["gather_sizes"][1:] == theirs["gather_sizes"][1:]  # the same buckets, too


@pytest.mark.parametrize("name", CASES)
def test_kept_parameters_train_like_torch_and_deepspeed(per_rank, name):
    mode = CASES[name][0]
    torch.manual_seed(0)
    ref = Net("none" if mode == "own" else mode)
    x, y = lib.make_data(STEPS, MICRO * 2)
    ref_losses = lib.train_reference(ref, x, y, weight_decay=0.0)
    ours = lib.mean_over_ranks([r[name, "ds_zero"]["losses"] for r in per_rank])
    theirs = lib.mean_over_ranks([r[name, "deepspeed"]["losses"] for r in per_rank])
    assert ours == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6)


def test_reuse_distance_keeps_parameters_from_forward_to_backward(results):
    psi = _psi_bytes()
    # Within the default distance (1e9 elements) every parameter is gathered once per step: Psi, not 2 Psi.
    for name in ("plain", "torch_ckpt", "own_ckpt"):
        assert results[name, "ds_zero"]["gathered"][1:] == [psi] * (STEPS - 1), name
    # With distance 0 and no prefetching each is gathered again in backward: 2 Psi (the counter counts).
    assert results["plain_no_reuse_no_prefetch", "ds_zero"]["gathered"][1:] == [2 * psi] * (STEPS - 1)
    # With prefetching, what the prefetcher passed over because it was still gathered is kept (DeepSpeed's
    # rule): only the embedding, whose backward use lies beyond the last bucket's reach, is gathered again.
    embed = sum(p.numel() * 4 for p in Net("none").embed.parameters())
    assert results["plain_no_reuse", "ds_zero"]["gathered"][-1] == psi + embed


def _max_live_case(rank, world, max_live):
    with lib.one_thread():
        import ds_zero
        from harness.pipelines.compare.comm import CommCounter

        torch.manual_seed(0)
        model = Net("none")
        engine, *_ = ds_zero.initialize(model=model, config=_config(world, stage3_max_live_parameters=max_live,
                                                                    stage3_prefetch_bucket_size=300))
        coord = engine.optimizer.coordinator
        seen = []
        hooks = [h for m in model.modules() for h in (
            m.register_forward_pre_hook(lambda *_: seen.append(coord.live_numel())),
            m.register_forward_hook(lambda *_: seen.append(coord.live_numel())))]
        x, y = lib.make_data(STEPS, MICRO * world)
        counter = CommCounter(world)
        gathered = []
        with counter:
            for s in range(STEPS):
                counter.reset()
                lib.train_ds(engine, x[s:s + 1], y[s:s + 1], rank, world, MICRO, 1)
                gathered.append(counter.totals()["by_op"]["all_gather_into_tensor"]["payload_bytes"])
        for h in hooks:
            h.remove()
        out = {"max_live": max(seen), "gathered": gathered, "params": lib.full_params(engine)}
        engine.destroy()
        return out


def test_max_live_parameters_bounds_what_stays_gathered():
    """DeepSpeed's max_live bounds prefetching only; here it also bounds what reuse keeps gathered."""
    max_live = 700  # of 1,844 elements: some parameters are kept for backward, not all
    r = run_ranks(_max_live_case, 2, max_live, timeout=240)[0]
    psi = _psi_bytes()
    assert 0 < r["max_live"] <= max_live, r["max_live"]
    assert all(psi < g < 2 * psi for g in r["gathered"][1:]), r["gathered"]
    torch.manual_seed(0)
    ref = Net("none")
    x, y = lib.make_data(STEPS, MICRO * 2)
    lib.train_reference(ref, x, y, weight_decay=0.0)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(r["params"][name], p.detach(), rtol=1e-4, atol=1e-5, msg=name)
