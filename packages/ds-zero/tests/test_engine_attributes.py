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


# DeepSpeedEngine's public surface users reach for (deepspeed/runtime/engine.py): attributes, then getters
ATTRIBUTES = ["local_rank", "global_rank", "world_size", "dp_world_size", "mp_world_size", "device", "global_steps",
              "global_samples", "micro_steps", "skipped_steps", "mpu", "dist_backend", "gradient_average",
              "enable_backward_allreduce", "client_optimizer", "client_lr_scheduler", "training"]
GETTERS = ["train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "get_lr", "get_mom",
           "get_type", "steps_per_print", "optimizer_name", "optimizer_params", "scheduler_name", "scheduler_params",
           "zero_optimization", "zero_optimization_stage", "zero_optimization_partition_gradients",
           "zero_optimization_partition_weights", "zero_cpu_offload", "zero_use_cpu_optimizer", "zero_reduce_scatter",
           "zero_overlap_comm", "zero_contiguous_gradients", "zero_reduce_bucket_size", "zero_allgather_bucket_size",
           "zero_sub_group_size", "zero_prefetch_bucket_size", "zero_param_persistence_threshold",
           "zero_max_live_parameters", "zero_max_reuse_distance", "fp16_enabled", "bfloat16_enabled", "loss_scale",
           "dynamic_loss_scale", "initial_dynamic_scale", "dynamic_loss_scale_args", "gradient_clipping",
           "wall_clock_breakdown", "is_gradient_accumulation_boundary", "get_global_grad_norm", "was_step_applied"]


def _surface(engine, model, loader):
    out = {name: _describe(getattr(engine, name)) for name in ATTRIBUTES}
    out["device"] = str(engine.device)
    out.update({f"{name}()": _describe(getattr(engine, name)()) for name in GETTERS})
    out["module is the model"] = engine.module is model
    out["lr_scheduler"] = type(engine.lr_scheduler).__name__
    out["optimizer.param_groups"] = len(engine.optimizer.param_groups)
    out["training_dataloader batches"] = len(loader)
    out["module_state_dict keys"] = sorted(engine.module_state_dict())
    return out


def _public_surface(rank, world):
    with lib.one_thread():
        import deepspeed
        import deepspeed.ops
        import ds_zero

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        x, y = lib.make_data(1, 8 * GAS * world)
        data = torch.utils.data.TensorDataset(x[0], y[0])
        results = {}
        for stage, dtype in ((0, "fp32"), (1, "fp32"), (2, "bf16"), (3, "fp32")):
            for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
                model = lib.make_model()
                cfg = lib.base_config(stage, world, gas=GAS, gradient_clipping=1.0, steps_per_print=5,
                                      scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 4}})
                cfg["bf16"] = {"enabled": dtype == "bf16"}
                engine, _, loader, _ = init(model=model, model_parameters=model.parameters(), config=cfg,
                                            training_data=data)
                out = {"init": _surface(engine, model, loader)}
                for m, (xb, yb) in enumerate(loader):
                    xb = xb.to(torch.bfloat16) if dtype == "bf16" else xb
                    engine.backward(torch.nn.functional.mse_loss(engine(xb).float(), yb))
                    engine.step()
                    out[f"micro {m}"] = _surface(engine, model, loader)
                engine.set_gradient_accumulation_boundary(True)
                out["forced boundary"] = engine.is_gradient_accumulation_boundary()
                out["eval() returns"] = type(engine.eval()).__name__, engine.training
                results[(stage, impl)] = out
                if impl == "ds_zero":
                    engine.destroy()
        return results


def test_public_attributes_and_getters_equal_deepspeeds_on_the_same_config(monkeypatch):
    """Each name in ATTRIBUTES and GETTERS read on both engines at stages 0-3 (stage 2 in bf16), after
    initialize and after every micro-step of a 2-step run over ``training_data``."""
    results = run_ranks(_public_surface, 2, timeout=300, fresh=True)
    for rank, rank_results in enumerate(results):
        for stage in (0, 1, 2, 3):
            theirs, ours = rank_results[(stage, "deepspeed")], rank_results[(stage, "ds_zero")]
            assert ours.keys() == theirs.keys() and len(theirs) >= 6
            for when in theirs:
                if not isinstance(theirs[when], dict):
                    assert ours[when] == theirs[when], (stage, when)
                    continue
                for key, value in theirs[when].items():
                    mine = ours[when][key]
                    if isinstance(value, tuple) and value and isinstance(value[-1], float):
                        assert mine[:-1] == value[:-1] and mine[-1] == pytest.approx(value[-1], rel=1e-4), \
                            (rank, stage, when, key, mine, value)
                    else:
                        assert mine == value, (rank, stage, when, key, mine, value)
        assert rank_results[(0, "ds_zero")]["init"]["local_rank"] == ("int", rank)
