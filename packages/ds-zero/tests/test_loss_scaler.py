"""Mixed precision: fp16 (dynamic loss scale) and bf16 track the fp32 torch run; an fp16 overflow on
one rank makes every rank skip the step, halves the scale and leaves weights and schedule alone."""

import importlib.util
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS, MICRO = 6, 4


def _mixed_cases(rank, world):
    with lib.one_thread():
        return _mixed_cases_body(rank, world)


def _mixed_cases_body(rank, world):
    import ds_zero

    out = {}
    x, y = lib.make_data(STEPS, MICRO * world)
    for stage in (1, 2, 3):
        for prec in ("fp16", "bf16"):
            cfg = lib.base_config(stage, world, micro=MICRO, gradient_clipping=1.0)
            cfg[prec] = {"enabled": True}
            dtype = torch.float16 if prec == "fp16" else torch.bfloat16
            engine, *_ = ds_zero.initialize(model=lib.make_model(), config=cfg)
            losses = lib.train_ds(engine, x, y, rank, world, MICRO, 1, dtype)
            out[(stage, prec)] = (losses, lib.full_params(engine), engine.optimizer.loss_scale)
            engine.destroy()
        # Overflow: rank 1 feeds an inf at step 2; hysteresis 1 so the first overflow halves the scale.
        cfg = lib.base_config(stage, world, micro=MICRO)
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 10, "hysteresis": 1, "loss_scale_window": 2}
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 0.01,
                                                            "warmup_min_lr": 0.001, "warmup_type": "linear"}}
        engine, *_ = ds_zero.initialize(model=lib.make_model(), config=cfg)
        trace = []
        for s in range(6):
            xb, yb = lib.rank_batches(x, y, s, rank, world, MICRO, 1)[0]
            xb = xb.half()
            if s == 2 and rank == 1:
                xb[0, 0] = float("inf")
            before = lib.full_params(engine)
            loss = torch.nn.functional.mse_loss(engine(xb).float(), yb)
            engine.backward(loss)
            engine.step()
            after = lib.full_params(engine)
            changed = any(not torch.equal(before[k], after[k]) for k in before)
            trace.append((engine.optimizer.loss_scale, changed, engine.get_lr()[0], engine.skipped_steps))
        out[(stage, "overflow")] = trace
        engine.destroy()
    # Stage 0 (DeepSpeed's FP16_Optimizer): the default hysteresis 2 does not delay the halving, and overflowing
    # at min_loss_scale keeps skipping instead of raising.
    cfg = lib.base_config(0, world, micro=MICRO)
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 10, "min_loss_scale": 512}
    engine, *_ = ds_zero.initialize(model=lib.make_model(), config=cfg)
    trace = []
    for s in range(6):
        xb, yb = lib.rank_batches(x, y, s, rank, world, MICRO, 1)[0]
        xb = xb.half()
        if s in (2, 3) and rank == 1:
            xb[0, 0] = float("inf")
        engine.backward(torch.nn.functional.mse_loss(engine(xb).float(), yb))
        engine.step()
        trace.append((engine.optimizer.loss_scale, engine.skipped_steps))
    out[(0, "overflow")] = trace
    engine.destroy()
    return out


def test_mixed_precision_and_fp16_overflow():
    """One harness call feeds both checks (a shared fixture would rerun per xdist worker)."""
    results = run_ranks(_mixed_cases, 2, timeout=240)
    _check_fp16_and_bf16_track_fp32_torch(results)
    _check_fp16_overflow_skips_step_and_halves_scale(results)


def _check_fp16_and_bf16_track_fp32_torch(results):
    x, y = lib.make_data(STEPS, MICRO * 2)
    ref = lib.make_model()
    ref_losses = lib.train_reference(ref, x, y, clip=1.0)
    for stage in (1, 2, 3):
        for prec in ("fp16", "bf16"):
            losses = lib.mean_over_ranks([r[(stage, prec)][0] for r in results])
            tol = 2e-2 if prec == "bf16" else 5e-3
            assert losses == pytest.approx(ref_losses, rel=tol, abs=tol), (stage, prec)
            params = results[0][(stage, prec)][1]
            for name, p in ref.named_parameters():
                torch.testing.assert_close(params[name], p.detach(), rtol=5e-2, atol=tol, msg=f"{stage} {prec}")
            scale = results[0][(stage, prec)][2]
            assert scale == (2.0**16 if prec == "fp16" else 1.0)


def _check_fp16_overflow_skips_step_and_halves_scale(results):
    for stage in (1, 2, 3):
        per_rank = [r[(stage, "overflow")] for r in results]
        assert per_rank[0] == per_rank[1]  # every rank skipped the same step
        trace = per_rank[0]
        scales = [t[0] for t in trace]
        changed = [t[1] for t in trace]
        lrs = [t[2] for t in trace]
        assert changed == [True, True, False, True, True, True], stage
        assert scales[:3] == [1024.0, 1024.0, 512.0], stage
        assert scales[4] == 512.0 and scales[5] == 1024.0  # regrows after loss_scale_window clean steps
        assert lrs[2] == lrs[1] and lrs[3] > lrs[2]  # the schedule does not advance on a skipped step
        assert [t[3] for t in trace] == [0, 0, 1, 1, 1, 1]
    for r in results:
        assert r[(0, "overflow")] == [(1024.0, 0), (1024.0, 0), (512.0, 1), (512.0, 2), (512.0, 2), (512.0, 2)]
