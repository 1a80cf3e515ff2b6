"""ZeRO-Offload (CPU): with ``offload_optimizer`` (stages 1-3) and ``offload_param`` (stage 3) the loss curve is the
non-offloaded engine's, and the states are really in host memory: the engine-side optimizer bytes are zero, the
host side holds exactly the masters, their fp32 gradients and both Adam moments (summed tensor bytes), every
optimizer tensor is one of the host pool's, gradients reach host memory while backward is still running, and a
checkpoint resumes bitwise. Cases follow DeepSpeed's tests/unit/v1/zero/test_zero.py offload variants and
tests/unit/v1/zero/test_zero_cpu_offload_grad_accum.py (accumulation with offload)."""

import importlib.util
import os
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS, MICRO, GAS = 5, 2, 2
CASES = [(1, False), (2, False), (3, False), (3, True)]  # (stage, offload_param)


def _config(stage, world, offload: bool, offload_param: bool):
    cfg = lib.base_config(stage, world, micro=MICRO, gas=GAS, gradient_clipping=0.5)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if offload:
        # no torch_adam: with offload the engine steps DeepSpeedCPUAdam, as DeepSpeed does
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if offload_param:
            cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    return cfg


def _offload_cases(rank, world, root):
    with lib.one_thread():
        return _offload_cases_body(rank, world, root)


def _offload_cases_body(rank, world, root):
    import ds_zero
    from ds_zero.ops import DeepSpeedCPUAdam

    out = {}
    x, y = lib.make_data(STEPS, MICRO * GAS * world)
    for stage, offload_param in CASES:
        runs = {}
        for offload in (False, True):
            engine, *_ = ds_zero.initialize(model=lib.make_model(hidden=32),
                                            config=_config(stage, world, offload, offload_param))
            events = []
            if offload:
                opt = engine.optimizer
                real = opt.grad_offloader.submit

                def submit(*a, real=real, events=events, **k):
                    events.append("offload")
                    return real(*a, **k)

                opt.grad_offloader.submit = submit
                hook = engine.module.body[0].weight.register_post_accumulate_grad_hook(
                    lambda p, events=events: events.append("first_layer_grad"))
            losses = lib.train_ds(engine, x, y, rank, world, MICRO, GAS)
            run = {"losses": losses, "params": lib.full_params(engine), "memory": engine.memory_breakdown()}
            if offload:
                hook.remove()
                opt = engine.optimizer
                host_ok = all(opt.host.holds(t) and t.device.type == "cpu"
                              for t in opt.master_partitions + opt.optimizer_state_tensors() + opt.fp32_grads)
                run.update(events=events, host_ok=host_ok, cpu_adam=isinstance(opt.optimizer, DeepSpeedCPUAdam),
                           numel=sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                                     for p in engine.module.parameters()))
                # Resume: a checkpoint after 3 steps continues exactly.
                save = os.path.join(root, f"s{stage}{int(offload_param)}")
                fresh, *_ = ds_zero.initialize(model=lib.make_model(hidden=32),
                                               config=_config(stage, world, True, offload_param))
                lib.train_ds(fresh, x[:3], y[:3], rank, world, MICRO, GAS)
                fresh.save_checkpoint(save)
                straight = lib.train_ds(fresh, x[3:], y[3:], rank, world, MICRO, GAS)
                fresh.destroy()
                again, *_ = ds_zero.initialize(model=lib.make_model(hidden=32, ),
                                               config=_config(stage, world, True, offload_param))
                again.load_checkpoint(save)
                run["resume"] = (straight, lib.train_ds(again, x[3:], y[3:], rank, world, MICRO, GAS))
                again.destroy()
            engine.destroy()
            runs[offload] = run
        out[(stage, offload_param)] = runs
    return out


def test_cpu_offload_trains_like_the_engine_with_states_in_host_memory(tmp_path):
    results = run_ranks(_offload_cases, 2, str(tmp_path), timeout=300)
    world = 2
    for stage, offload_param in CASES:
        for r in results:
            base, off = r[(stage, offload_param)][False], r[(stage, offload_param)][True]
            case = (stage, offload_param)
            # CPUAdam vs torch's AdamW: equal to fp32 rounding (see test_cpu_adam), so the curves agree closely.
            assert off["losses"] == pytest.approx(base["losses"], rel=1e-5), case
            for name, p in base["params"].items():
                torch.testing.assert_close(off["params"][name], p, rtol=1e-4, atol=1e-5, msg=f"{case} {name}")
            assert max(base["losses"]) - min(base["losses"]) > 1e-2  # it trained
            assert off["cpu_adam"] and off["host_ok"], case
            psi_n = -(-off["numel"] // world)  # this rank's partition (padding is at most world - 1 elements)
            dev, host = off["memory"], off["memory"]["offload"]["cpu"]
            assert dev["optimizer_states"] == 0, case  # nothing of the optimizer on the engine's side
            assert host["optimizer_states"] == pytest.approx(12 * psi_n, abs=12 * world), case
            assert host["gradients"] == pytest.approx(4 * psi_n, abs=4 * world), case
            assert base["memory"]["optimizer_states"] == pytest.approx(host["optimizer_states"], abs=12 * world)
            assert base["memory"]["offload"]["cpu"]["total"] == 0
            if offload_param:
                assert host["parameters"] == pytest.approx(4 * psi_n, abs=4 * world)
                assert dev["parameters"] == 0  # nothing gathered between steps (persistence threshold 0)
            if stage >= 2:
                # Gradients streamed to host as their buckets were reduced: some before backward reached the
                # first layer (the last gradient autograd produces).
                ev = off["events"]
                assert ev.index("offload") < ev.index("first_layer_grad"), (case, ev[:20])
                assert dev["gradients"] == 0  # no device gradient partition at all
            straight, resumed = off["resume"]
            assert resumed == straight, case
