"""The attributes DeepSpeed's tests and users read on the engine and its optimizer, one type each as DeepSpeed's,
side by side with DeepSpeed on the same JSON (2 ranks, gloo): ``optimizer._global_grad_norm`` (DeepSpeed's ZeRO-3
partitioning tests in ``tests/unit/runtime/zero/test_zero.py`` read it), ``get_global_grad_norm()``,
``optimizer.loss_scale`` / ``cur_scale``, ``engine.loss_scale()``, ``global_steps``, ``global_samples``,
``skipped_steps``, ``was_step_applied()``, and the engine's fall-back to the wrapped module's attributes
(``DeepSpeedEngine.__getattr__``)."""

import importlib.util
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

pytest.importorskip("deepspeed")
GAS, STEPS = 2, 2


def _describe(value):
    """Type (and value) of what an attribute read gave: what the comparison is about."""
    if isinstance(value, torch.Tensor):
        return ("Tensor", tuple(value.shape), value.item())
    return (type(value).__name__, value)


def _read(engine, opt, tag, out):
    for name, get in (
        ("optimizer._global_grad_norm", lambda: opt._global_grad_norm),
        ("get_global_grad_norm()", engine.get_global_grad_norm),
        ("optimizer.loss_scale", lambda: opt.loss_scale),
        ("optimizer.cur_scale", lambda: opt.cur_scale),
        ("loss_scale()", engine.loss_scale),
        ("global_steps", lambda: engine.global_steps),
        ("global_samples", lambda: engine.global_samples),
        ("skipped_steps", lambda: engine.skipped_steps),
        ("was_step_applied()", engine.was_step_applied),
    ):
        out[(tag, name)] = _describe(get())


def _attributes(rank, world):
    with lib.one_thread():
        import deepspeed
        import deepspeed.ops
        import ds_zero

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        x, y = lib.make_data(STEPS, 4 * GAS * world)
        results = {}
        for stage in (1, 2, 3):
            for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
                model = lib.make_model()
                model.id = 7  # DeepSpeed's tests (test_ds_initialize.py) read module attributes through the engine
                cfg = lib.base_config(stage, world, gas=GAS, gradient_clipping=1.0)
                engine, opt, _, _ = init(model=model, model_parameters=model.parameters(), config=cfg)
                out = {("init", "module attribute"): _describe(engine.id),
                       ("init", "submodule"): _describe(engine.body is model.body)}
                _read(engine, opt, "init", out)
                for s in range(STEPS):
                    for m, (xb, yb) in enumerate(lib.rank_batches(x, y, s, rank, world, 4, GAS)):
                        engine.backward(torch.nn.functional.mse_loss(engine(xb), yb))
                        engine.step()
                        _read(engine, opt, f"step {s} micro {m}", out)
                with pytest.raises(AttributeError) as missing:
                    _ = engine.no_such_attribute
                out["missing"] = str(missing.value)
                results[(stage, impl)] = out
                if impl == "ds_zero":
                    engine.destroy()
        return results


def test_engine_and_optimizer_attributes_have_deepspeeds_types_and_values():
    results = run_ranks(_attributes, 2, timeout=300, fresh=True)  # DeepSpeed leaves process-wide state
    for rank_results in results:
        for stage in (1, 2, 3):
            theirs, ours = rank_results[(stage, "deepspeed")], rank_results[(stage, "ds_zero")]
            assert ours.keys() == theirs.keys()
            for key in theirs:
                if key == "missing":
                    assert ours[key] == "'DeepSpeedEngine' object has no attribute 'no_such_attribute'"
                    continue
                assert ours[key][:-1] == theirs[key][:-1], (stage, key)  # the type (and a tensor's shape)
                value = theirs[key][-1]
                approx = pytest.approx(value, rel=1e-5) if isinstance(value, float) else value
                assert ours[key][-1] == approx, (stage, key)
    norm = results[0][(1, "ds_zero")][("step 1 micro 1", "optimizer._global_grad_norm")]
    assert norm[0] == "Tensor" and norm[1] == () and norm[2] > 0  # the case DeepSpeed's ZeRO-3 tests read
