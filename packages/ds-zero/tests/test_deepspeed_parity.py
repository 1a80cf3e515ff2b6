"""Side by side with real DeepSpeed 0.19.8 on CPU (gloo): same model, same JSON config file, same data.

All DeepSpeed work is in one harness call (its import and engine set-up are slow). DeepSpeed's
shared-memory all-reduce op is switched off so it uses plain torch.distributed, the same engine as
ds_zero, and does not JIT-compile C++ in the test.
"""

import importlib.util
import json
import pathlib

import pytest

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS, MICRO, GAS = 10, 2, 2


def _configs(world: int) -> dict:
    out = {}
    for stage in (1, 2, 3):
        cfg = lib.base_config(stage, world, micro=MICRO, gas=GAS, gradient_clipping=0.5)
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2,
                                                            "warmup_num_steps": 4, "warmup_type": "linear"}}
        out[f"stage{stage}"] = cfg
    bf16 = lib.base_config(2, world, micro=MICRO, gas=1, bf16={"enabled": True})
    out["stage2_bf16"] = bf16
    return out


def _lr_curves(sched_module, optimizer_factory):
    curves = {}
    specs = {"WarmupLR": dict(warmup_min_lr=0.001, warmup_max_lr=0.01, warmup_num_steps=5),
             "WarmupDecayLR": dict(total_num_steps=12, warmup_min_lr=0.0, warmup_max_lr=0.02, warmup_num_steps=4,
                                   warmup_type="linear"),
             "WarmupCosineLR": dict(total_num_steps=12, warmup_min_ratio=0.1, warmup_num_steps=3,
                                    cos_min_ratio=0.01)}
    for name, kw in specs.items():
        opt = optimizer_factory()
        sched = getattr(sched_module, name)(opt, **kw)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(14):
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        curves[name] = lrs
    return curves


def _scaler_trace(make_scaler):
    s = make_scaler()
    pattern = [False, True, True, False, False, False, True, False, False, False, False, False]
    out = []
    for overflow in pattern:
        s.update_scale(overflow)
        out.append(s.cur_scale)
    return out


def _side_by_side(rank, world, paths):
    with lib.one_thread():
        return _side_by_side_body(rank, world, paths)


def _side_by_side_body(rank, world, paths):
    import deepspeed
    import deepspeed.ops
    import ds_zero
    import torch
    from deepspeed.runtime import lr_schedules as ds_sched
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler as DsScaler
    from ds_zero.runtime import lr_schedules as our_sched
    from ds_zero.runtime.fp16.loss_scaler import DynamicLossScaler as OurScaler

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    results = {}
    for name, path in paths.items():
        micro = json.load(open(path))["train_micro_batch_size_per_gpu"]
        gas = json.load(open(path)).get("gradient_accumulation_steps", 1)
        dtype = torch.bfloat16 if "bf16" in name else None
        x, y = lib.make_data(STEPS, micro * gas * world)
        per_impl = {}
        for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
            model = lib.make_model()
            engine, _, _, _ = init(model=model, model_parameters=model.parameters(), config=path)
            per_impl[impl] = lib.train_ds(engine, x, y, rank, world, micro, gas, dtype=dtype)
            per_impl[impl + "_lr"] = engine.get_lr()[0]
            if impl == "ds_zero":
                engine.destroy()
        results[name] = per_impl
    sgd = lambda: torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.05)
    results["lr"] = (_lr_curves(ds_sched, sgd), _lr_curves(our_sched, sgd))
    scaler_kw = dict(init_scale=2.0**8, scale_window=3, min_scale=1.0, delayed_shift=2, consecutive_hysteresis=False)
    results["scaler"] = (_scaler_trace(lambda: DsScaler(**scaler_kw)), _scaler_trace(lambda: OurScaler(**scaler_kw)))
    results["scaler_stage0"] = _stage0_scaler_traces()
    return results


def _stage0_scaler_traces():
    """ZeRO stage 0 in fp16 is DeepSpeed's FP16_(Unfused)Optimizer, whose _update_scale we call on its own config."""
    import types

    import torch
    from deepspeed.runtime.fp16 import loss_scaler as ds_ls
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    from ds_zero.runtime.fp16.loss_scaler import FP16OptimizerLossScaler

    # Seven overflows in a row reach min_scale (ours raised there, with ZeRO's scaler); then recovery.
    pattern = [True] * 7 + [False] * 7 + [True, False, False, False]
    args = {ds_ls.INITIAL_LOSS_SCALE: 2.0**6, ds_ls.SCALE_WINDOW: 3, ds_ls.MIN_LOSS_SCALE: 2.0,
            ds_ls.DELAYED_SHIFT: 2, ds_ls.CONSECUTIVE_HYSTERESIS: False}
    traces = {}
    for name, cls in (("fused", FP16_Optimizer), ("unfused", FP16_UnfusedOptimizer)):
        cfg = ds_ls.LossScaleConfig(torch.float16, True, 1.0, args, profile=ds_ls.LossScaleProfile.UNFUSED)
        holder = types.SimpleNamespace(loss_scale_config=cfg, verbose=False)
        trace = []
        for overflow in pattern:
            cls._update_scale(holder, overflow)
            trace.append(cfg.cur_scale)
        traces[name] = trace
    ours = FP16OptimizerLossScaler(init_scale=2.0**6, scale_window=3, min_scale=2.0, delayed_shift=2)
    traces["ds_zero"] = []
    for overflow in pattern:
        ours.update_scale(overflow)
        traces["ds_zero"].append(ours.cur_scale)
    return traces


def test_loss_sequences_match_deepspeed(tmp_path):
    world = 2
    paths = {}
    for name, cfg in _configs(world).items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        paths[name] = str(path)
    results = run_ranks(_side_by_side, world, paths, fresh=True, timeout=300)
    for name in paths:
        ds = lib.mean_over_ranks([r[name]["deepspeed"] for r in results])
        ours = lib.mean_over_ranks([r[name]["ds_zero"] for r in results])
        tol = dict(rel=2e-2, abs=1e-3) if "bf16" in name else dict(rel=1e-5, abs=1e-6)
        assert ours == pytest.approx(ds, **tol), name
        assert results[0][name]["ds_zero_lr"] == pytest.approx(results[0][name]["deepspeed_lr"]), name
        # Sanity: the loss moved, so equal sequences are not a constant.
        assert max(ds) - min(ds) > 1e-2
    ds_lr, our_lr = results[0]["lr"]
    for name in ds_lr:
        assert our_lr[name] == pytest.approx(ds_lr[name], rel=1e-12, abs=1e-15), name
    ds_scale, our_scale = results[0]["scaler"]
    assert our_scale == ds_scale
    assert len(set(ds_scale)) > 2
    # Stage 0's fp16 rule: halve on every overflow (no hysteresis), clamp at min_loss_scale without raising.
    stage0 = results[0]["scaler_stage0"]
    assert stage0["ds_zero"] == stage0["unfused"] == stage0["fused"]
    assert stage0["ds_zero"][:7] == [32.0, 16.0, 8.0, 4.0, 2.0, 2.0, 2.0]


def _stage0_low_precision(rank, world):
    """Stage 0 in bf16 and fp16, AdamW with weight decay (DeepSpeed's FP16_Optimizer / FP16_UnfusedOptimizer path,
    which steps the torch optimizer once on zero gradients when it is built)."""
    with lib.one_thread():
        import deepspeed
        import deepspeed.ops
        import ds_zero
        import torch

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        from deepspeed.accelerator import get_accelerator

        x, y = lib.make_data(4, MICRO * world)
        out = {}
        fp16 = get_accelerator().is_fp16_supported()
        kinds = [(torch.bfloat16, "bf16")] + ([(torch.float16, "fp16")] if fp16 else [])
        for dtype, key in kinds:
            cfg = lib.base_config(0, world, micro=MICRO, gradient_clipping=1.0, **{key: {"enabled": True}})
            for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
                model = lib.make_model()
                engine, *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
                losses = lib.train_ds(engine, x, y, rank, world, MICRO, 1, dtype)
                out[(key, impl)] = (losses, [p.detach().float().clone() for p in model.parameters()])
                if impl == "ds_zero":
                    engine.destroy()
        return out


def test_stage0_fp16_and_bf16_train_as_deepspeed_from_the_first_update():
    """The launcher runs' drift in the 4th digit from step 1: at stage 0 DeepSpeed's fp16/bf16 wrapper builds the
    Adam state with a zero-gradient step, so its first update is Adam's second (and weight decay applied once)."""
    import torch

    results = run_ranks(_stage0_low_precision, 2, timeout=300, fresh=True)  # DeepSpeed leaves process-wide state
    for r in results:
        kinds = sorted({key for key, _ in r})  # fp16 where DeepSpeed's accelerator supports it (not this CPU)
        assert "bf16" in kinds
        for key in kinds:
            (t_losses, t_params), (o_losses, o_params) = r[(key, "deepspeed")], r[(key, "ds_zero")]
            assert o_losses == t_losses, (key, o_losses, t_losses)  # bitwise: the same arithmetic in the same order
            for a, b in zip(t_params, o_params):
                torch.testing.assert_close(b, a, rtol=0, atol=0)
            assert t_losses[1] != t_losses[0]  # the steps updated the model
