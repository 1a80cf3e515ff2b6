"""Per-rank memory (summed tensor bytes) matches ZeRO's formulas within 5% (bf16 + Adam, K = 12)."""

import importlib.util
import pathlib

import pytest

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)


def _breakdowns(rank, world):
    with lib.one_thread():
        return _breakdowns_body(rank, world)


def _breakdowns_body(rank, world):
    import ds_zero
    import torch

    out = {}
    x, y = lib.make_data(2, 4 * world)
    for stage in (0, 1, 2, 3):
        cfg = lib.base_config(stage, world, micro=4, bf16={"enabled": True})
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        model = lib.make_model(hidden=64)
        numel = sum(p.numel() for p in model.parameters())
        engine, *_ = ds_zero.initialize(model=model, config=cfg)
        inside = {}
        head = engine.module.head
        live = head.weight.numel() + head.bias.numel()

        def record(module, args, output, inside=inside, engine=engine):
            inside.setdefault("bd", engine.memory_breakdown())

        hook = head.register_forward_hook(record)
        lib.train_ds(engine, x, y, rank, world, 4, 1, torch.bfloat16)
        hook.remove()
        out[stage] = dict(after=engine.memory_breakdown(), inside=inside["bd"], numel=numel, live=live)
        engine.destroy()
    return out


def test_memory_breakdown_matches_zero_formulas():
    world = 2
    from ds_zero.memory import zero_memory_formula

    results = run_ranks(_breakdowns, world, timeout=240)
    for r in results:
        for stage, res in r.items():
            expect = zero_memory_formula(res["numel"], world, stage, param_bytes=2, optimizer_bytes=12)
            got = res["after"]
            for key in ("parameters", "gradients", "optimizer_states", "total"):
                assert got[key] == pytest.approx(expect[key], rel=0.05), (stage, key, got, expect)
            if stage == 3:
                # Inside the head's forward its full bf16 params are live on top of the partitions.
                extra = res["inside"]["parameters"] - got["parameters"]
                assert extra == pytest.approx(2 * res["live"], rel=0.05)
    # Sanity: each stage really saves memory relative to the previous one.
    totals = [results[0][s]["after"]["total"] for s in (0, 1, 2, 3)]
    assert totals == sorted(totals, reverse=True) and totals[3] < totals[0] / (world * 0.9)
