"""The pipeline engine: 2 and 4 stages (and 2 stages x 2 data-parallel replicas with ZeRO-1) train exactly like the
unpipelined model (losses and parameters, SGD with clipping so the cross-stage norm shows), tied layers too;
DeepSpeed's tests/unit/runtime/pipe/test_pipe.py gradient-accumulation scaling case and tests/unit/pipe/
test_pipe_module.py sequential-model case (with activation checkpoints) ported; with equal-cost stages the
measured idle fraction of every stage is (p-1)/(m+p-1) within 10%, and the micro-batches whose activations are
alive at once on a stage (counted with saved-tensor hooks) never exceed p for 1F1B, against m for GPipe;
invalid pipelines fail before any communication."""

import collections
import copy
import importlib.util
import logging
import pathlib
import time
import weakref

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

DIM, MICRO, BASE_SEED, STEPS = 8, 2, 1234, 3


def _specs(tied: bool):
    from ds_zero.pipe import LayerSpec, TiedLayerSpec

    # both tensors tied, so one module in the reference is the same model (DeepSpeed ties only the named attrs)
    tie = dict(tied_weight_attr=["weight", "bias"])
    first = TiedLayerSpec("emb", torch.nn.Linear, DIM, DIM, **tie) if tied else LayerSpec(torch.nn.Linear, DIM, DIM)
    body = [
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, DIM, 2 * DIM),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, 2 * DIM, DIM),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, DIM, DIM),
        LayerSpec(torch.nn.Tanh),
    ]
    last = TiedLayerSpec("emb", torch.nn.Linear, DIM, DIM, **tie) if tied else LayerSpec(torch.nn.Linear, DIM, DIM)
    return [first, *body, last]


def _reference(tied: bool):
    """The same layers built in one process with the pipeline's per-layer seeds; a tied key is one module."""
    layers, tied_module = [], None
    for i, spec in enumerate(_specs(tied)):
        torch.manual_seed(BASE_SEED + i)
        if getattr(spec, "key", None) == "emb":
            tied_module = tied_module or spec.build()
            layers.append(tied_module)
        else:
            layers.append(spec.build())
    return torch.nn.Sequential(*layers)


def _config(dp: int, gas: int, zero: int):
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}},
        "zero_optimization": {"stage": zero},
    }


def _data(gas, dp):
    g = torch.Generator().manual_seed(3)
    return torch.randn(STEPS, gas * dp * MICRO, DIM, generator=g), torch.randn(
        STEPS, gas * dp * MICRO, DIM, generator=g
    )


def _micro_batches(x, y, step, dp_rank, dp, gas):
    return [(a, b) for a, b in lib.rank_batches(x, y, step, dp_rank, dp, MICRO, gas)]


def _equivalence_cases(rank, world, cases):
    with lib.one_thread():
        return _equivalence_body(rank, world, cases)


def _equivalence_body(rank, world, cases):
    import ds_zero
    from ds_zero.pipe import PipeDataParallelTopology, PipelineModule

    out = {}
    for pp, gas, zero, tied, ckpt in cases:
        dp = world // pp
        topo = PipeDataParallelTopology(num_pp=pp, num_dp=dp)
        model = PipelineModule(
            _specs(tied),
            topology=topo,
            loss_fn=torch.nn.MSELoss(),
            seed_layers=True,
            base_seed=BASE_SEED,
            partition_method="parameters",
            activation_checkpoint_interval=ckpt,
        )
        engine, *_ = ds_zero.initialize(model=model, config=_config(dp, gas, zero))
        x, y = _data(gas, dp)
        losses = []
        for s in range(STEPS):
            losses.append(
                engine.train_batch(iter(_micro_batches(x, y, s, engine.grid.get_data_parallel_id(), dp, gas))).item()
            )
        params = {}
        for idx in range(model._local_start, model._local_stop):
            spec = model._layer_specs[idx]
            mod = model.tied_modules[spec.key] if getattr(spec, "key", None) else getattr(model, str(idx), None)
            for n, p in mod.named_parameters() if mod is not None else []:
                params[f"{idx}.{n}"] = p.detach().clone()
        out[(pp, gas, zero, tied, ckpt)] = dict(
            losses=losses, params=params, parts=model.parts, norm=engine.get_global_grad_norm()
        )
        engine.destroy()
    return out


def _train_reference(tied: bool, gas: int, dp: int):
    ref = _reference(tied)
    optim = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    x, y = _data(gas, dp)
    losses = []
    for s in range(STEPS):
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(ref(x[s]), y[s])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        optim.step()
        losses.append(loss.item())
    return ref, losses


def _check_equivalence(results, cases):
    for case in cases:
        pp, gas, zero, tied, _ = case
        dp = len(results) // pp
        ref, ref_losses = _train_reference(tied, gas, dp)
        ref_params = {f"{i}.{n}": p for i, layer in enumerate(ref) for n, p in layer.named_parameters()}
        seen = set()
        for r in results:
            res = r[case]
            assert res["losses"] == pytest.approx(ref_losses, rel=1e-5), case  # every stage returns the loss
            for name, p in res["params"].items():
                torch.testing.assert_close(p, ref_params[name], rtol=1e-5, atol=1e-6, msg=f"{case} {name}")
                seen.add(name)
        assert seen == set(ref_params), (case, set(ref_params) - seen)
        assert len(results[0][case]["parts"]) == pp + 1


PIPE4 = [(4, 4, 0, False, 0), (2, 4, 1, False, 0)]  # 4 stages; 2 stages x 2 replicas with ZeRO-1
PIPE2 = [(2, 3, 0, True, 0), (2, 2, 1, False, 2)]  # tied first/last layers; activation checkpoints every 2 layers


def test_pipeline_equals_the_unpipelined_model_4_ranks():
    _check_equivalence(run_ranks(_equivalence_cases, 4, PIPE4, timeout=240), PIPE4)


def _small_cases(rank, world):
    with lib.one_thread():
        return _small_cases_body(rank, world)


def _small_cases_body(rank, world):
    import ds_zero
    from ds_zero.config import DeepSpeedConfigError
    from ds_zero.pipe import PipelineError, PipelineModule

    out = {"equivalence": _equivalence_body(rank, world, PIPE2)}
    # Upstream's TestPipeGradientAccumulationScaling: gradients are scaled by 1/gas once, not twice.
    layers = [torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)]
    for layer in layers:
        layer.weight.data.fill_(1.0)
    model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss())
    cfg = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.0,  # as upstream's config: DeepSpeed clips at 1.0 by default
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "pipeline": {"activation_checkpoint_interval": 0},
    }
    engine, *_ = ds_zero.initialize(config=cfg, model=model, model_parameters=model.parameters())
    engine.set_dataiterator(iter([(torch.ones(1, 1), torch.zeros(1, 1))] * 2))
    engine.train_batch()
    out["gas_scaling"] = next(engine.module.parameters()).item()
    engine.destroy()
    # Upstream's test_pipe_module.py: a Sequential's layers, 2 stages, activation checkpoints, eval_batch.
    torch.manual_seed(0)
    seq = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)], torch.nn.Linear(32, 1))
    base = copy.deepcopy(seq)
    model = PipelineModule(layers=list(seq), num_stages=2, loss_fn=torch.nn.MSELoss(), activation_checkpoint_interval=1)
    cfg = {
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}},
    }
    engine, *_ = ds_zero.initialize(config=cfg, model=model)
    batch = (torch.randn(1, 32), torch.randn(1, 1))
    out["eval"] = (
        engine.eval_batch(iter([batch] * 2)).item(),
        torch.nn.functional.mse_loss(base(batch[0]), batch[1]).item(),
    )
    engine.destroy()
    # Validation: before any process group is made (no new_group call).
    import torch.distributed as dist

    real_new_group, calls = dist.new_group, []
    dist.new_group = lambda *a, **k: calls.append(1) or real_new_group(*a, **k)
    errors = {}
    try:
        try:
            PipelineModule([torch.nn.Linear(2, 2)], num_stages=2)
        except PipelineError as e:
            errors["stages"] = (str(e), len(calls))
        model = PipelineModule(_specs(False), num_stages=2, loss_fn=torch.nn.MSELoss())
        calls.clear()
        for name, cfg in (
            (
                "indivisible",
                {
                    "train_batch_size": 10,
                    "train_micro_batch_size_per_gpu": 4,
                    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                },
            ),
            ("zero2", {**_config(1, 2, 2)}),
        ):
            try:
                ds_zero.initialize(model=model, config=cfg)
            except DeepSpeedConfigError as e:
                errors[name] = (str(e), len(calls))
    finally:
        dist.new_group = real_new_group
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("ds_zero.pipe.engine").addHandler(handler)
    engine, *_ = ds_zero.initialize(model=model, config=_config(1, 1, 0))
    logging.getLogger("ds_zero.pipe.engine").removeHandler(handler)
    errors["warned"] = [r.getMessage() for r in records]
    with pytest.raises(PipelineError, match="Only train_batch"):
        engine(torch.ones(1))
    engine.destroy()
    out["errors"] = errors
    return out


def test_pipeline_2_ranks_tied_layers_checkpointing_upstream_cases_and_validation():
    results = run_ranks(_small_cases, 2, timeout=240)
    _check_equivalence([r["equivalence"] for r in results], PIPE2)
    for r in results:
        assert r["gas_scaling"] == pytest.approx(1.0 - 2.0 * 0.1)  # upstream's expected weight
        loss, ref = r["eval"]
        assert loss == pytest.approx(ref, rel=1e-5)
        err = r["errors"]
        assert "2 pipeline stages but only 1 layers" in err["stages"][0] and err["stages"][1] == 0
        assert "train_batch_size=10 is not divisible" in err["indivisible"][0] and err["indivisible"][1] == 0
        assert "zero_optimization.stage" in err["zero2"][0] and err["zero2"][1] == 0
        assert any("1 micro-batches for 2 pipeline stages" in m for m in err["warned"])


class _Sleep(torch.autograd.Function):
    """Equal-cost stages: a fixed wall time per pass, independent of the shared CPUs' load."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class SleepLayer(torch.nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(DIM))
        self.seconds = seconds

    def forward(self, x):
        return _Sleep.apply(x * self.w, self.seconds)


def _bubble_cases(rank, world, cases):
    import ds_zero
    import torch.distributed as dist
    from ds_zero.pipe import LayerSpec, PipelineModule
    from ds_zero.pipe.schedule import GPipeSchedule, TrainSchedule

    torch.set_num_threads(1)
    out = {}
    for micro_batches, seconds in cases:
        model = PipelineModule(
            [LayerSpec(SleepLayer, seconds) for _ in range(world)],
            num_stages=world,
            loss_fn=lambda out, y: (out - y).pow(2).mean(),
        )
        cfg = {
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": micro_batches,
            "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        }
        engine, *_ = ds_zero.initialize(model=model, config=cfg)
        data = [(torch.randn(MICRO, DIM), torch.randn(MICRO, DIM)) for _ in range(micro_batches)]
        engine.train_batch(iter(data))  # warm-up
        for name, cls in (("1f1b", TrainSchedule), ("gpipe", GPipeSchedule)):
            engine.train_schedule = cls
            # Timed passes: two batches, and the test reads the one with the shorter span (the other may have
            # waited on a core another job held; the schedule's own idle time is in both).
            out[(micro_batches, name)] = [_instrumented_batch(engine, data) for _ in range(2 if seconds > 0.05 else 1)]
            dist.barrier()
        engine.destroy()
    return out


def _instrumented_batch(engine, data):
    """One train_batch, counting the micro-batches whose saved tensors are alive and the freed sends."""
    live, peak, current, freed = collections.Counter(), [0], [None], []

    class Holder:
        __slots__ = ("t", "__weakref__")

    def pack(t):
        h = Holder()
        h.t = t
        live[current[0]] += 1
        weakref.finalize(h, live.subtract, [current[0]])
        return h

    real_forward, real_finish = engine._exec_forward_pass, engine._finish_sends

    def counted_forward(buffer_id):
        current[0] = engine._fwd_id
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
            real_forward(buffer_id)
        peak[0] = max(peak[0], sum(1 for v in live.values() if v > 0))

    def finish():
        sent = [ts for _, ts, free in engine._pending if free]
        real_finish()
        freed.extend(t.numel() for ts in sent for t in ts)

    engine._exec_forward_pass, engine._finish_sends = counted_forward, finish
    try:
        engine.train_batch(iter(data))
    finally:
        engine._exec_forward_pass, engine._finish_sends = real_forward, real_finish
    return {"timeline": engine.timeline, "peak_alive": peak[0], "freed": freed}


def test_bubble_fraction_and_activation_memory_1f1b_vs_gpipe():
    """Idle time: 4 stages x 4 micro-batches of 0.15 s passes (per-tick latency of the shared machine, a few ms,
    stays small against them). Activations: 4 stages x 8 micro-batches, short passes."""
    from ds_zero.pipe import measured_timeline

    stages, timed, counted = 4, (4, 0.15), (8, 0.005)
    results = run_ranks(_bubble_cases, stages, [timed, counted], timeout=240)
    m = timed[0]
    expected = (stages - 1) / (m + stages - 1)
    for name in ("1f1b", "gpipe"):
        attempts = [measured_timeline([r[(m, name)][i]["timeline"] for r in results]) for i in range(2)]
        t = min(attempts, key=lambda a: a["span"])
        for s, bubble in enumerate(t["bubble"]):
            assert bubble == pytest.approx(expected, rel=0.10), (name, s, t["bubble"])
    m = counted[0]
    for s, r in enumerate(results):
        one_f_one_b, gpipe = r[(m, "1f1b")][0], r[(m, "gpipe")][0]
        # every activation sent downstream was freed once sent (only its graph is kept for backward)
        assert len(one_f_one_b["freed"]) == (m if s < stages - 1 else 0) and set(one_f_one_b["freed"]) <= {0}
        assert one_f_one_b["peak_alive"] == min(stages - s, m) <= stages  # p - s on stage s
        assert gpipe["peak_alive"] == m  # every micro-batch at the turn
