"""Checkpoints: save -> load continues the identical loss curve (stages 1-3, fp16 too); crash-safe
writes; zero_to_fp32 (function and CLI) gives a plain fp32 state dict that loads into the torch model."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS, MICRO = 6, 2
CASES = [(1, False), (2, False), (3, False), (3, True), (0, False)]


def _config(stage, world, fp16):
    cfg = lib.base_config(stage, world, micro=MICRO)
    cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {"total_num_steps": 20, "warmup_num_steps": 3,
                                                            "warmup_max_lr": 0.01}}
    if fp16:
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


def _resume_cases(rank, world, root):
    with lib.one_thread():
        return _resume_cases_body(rank, world, root)


def _resume_cases_body(rank, world, root):
    import ds_zero
    import torch.distributed as dist
    from ds_zero._compat import checkpoint as ckpt  # atomic_torch_save is patched where save_checkpoint reads it

    out = {}
    x, y = lib.make_data(STEPS, MICRO * world)
    for stage, fp16 in CASES:
        dtype = torch.float16 if fp16 else None
        save_dir = os.path.join(root, f"s{stage}_{int(fp16)}")
        cfg = _config(stage, world, fp16)
        engine, *_ = ds_zero.initialize(model=lib.make_model(), config=cfg)
        first = lib.train_ds(engine, x[:3], y[:3], rank, world, MICRO, 1, dtype)
        engine.save_checkpoint(save_dir, client_state={"epoch": 7})
        straight = lib.train_ds(engine, x[3:], y[3:], rank, world, MICRO, 1, dtype)
        final = lib.full_params(engine)
        # A crash while overwriting the same tag, on every rank, must leave the old checkpoint loadable.
        real_save = ckpt.atomic_torch_save

        def crashing(obj, path, real_save=real_save):
            real_save(obj, path + ".junk")
            raise OSError("disk full (simulated)")

        ckpt.atomic_torch_save = crashing
        try:
            engine.save_checkpoint(save_dir, tag="global_step3")
            crashed = False
        except OSError:
            crashed = True
        finally:
            ckpt.atomic_torch_save = real_save
        dist.barrier()
        engine.destroy()
        fresh, *_ = ds_zero.initialize(model=lib.make_model(seed=5), config=cfg)
        path, client = fresh.load_checkpoint(save_dir)
        resumed = lib.train_ds(fresh, x[3:], y[3:], rank, world, MICRO, 1, dtype)
        out[(stage, fp16)] = dict(first=first, straight=straight, resumed=resumed, client=client, crashed=crashed,
                                  steps=fresh.global_steps, final=final, resumed_final=lib.full_params(fresh),
                                  path=path, scale=fresh.optimizer.loss_scale)
        fresh.save_checkpoint(save_dir, tag="final")
        fresh.destroy()
    return out


def test_checkpoint_resume_crash_safety_and_zero_to_fp32(tmp_path, capsys):
    """One harness call feeds all checks (ranks are expensive; a shared fixture would rerun per xdist worker)."""
    root = tmp_path / "ckpt"
    root.mkdir()
    resumed = (root, run_ranks(_resume_cases, 2, str(root), timeout=240))
    _check_identical_continuation(resumed)
    _check_zero_to_fp32_loads_into_plain_model(resumed, tmp_path)
    _check_zero_to_fp32_cli(resumed, tmp_path, capsys)


def _check_identical_continuation(resumed):
    _, results = resumed
    for r in results:
        for case, res in r.items():
            assert res["crashed"], case
            assert res["client"] == {"epoch": 7}
            assert res["steps"] == STEPS
            assert res["resumed"] == res["straight"], case  # bitwise: same partitions, states, schedule
            for name, p in res["final"].items():
                torch.testing.assert_close(res["resumed_final"][name], p, rtol=0, atol=0)


def _check_zero_to_fp32_loads_into_plain_model(resumed, tmp_path):
    from ds_zero.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
    from safetensors.torch import load_file

    root, results = resumed
    for stage, fp16 in CASES:
        out = tmp_path / f"s{stage}_{int(fp16)}.safetensors"
        convert_zero_checkpoint_to_fp32_state_dict(root / f"s{stage}_{int(fp16)}", out, tag="final")
        sd = load_file(str(out))
        model = lib.make_model(seed=9)
        model.load_state_dict(sd, strict=True)
        for name, p in model.named_parameters():
            assert p.dtype == torch.float32
            ref = results[0][(stage, fp16)]["resumed_final"][name]
            # the fp32 master; the engine's fp16 params are its rounding
            torch.testing.assert_close(p.detach(), ref, rtol=1e-3 if fp16 else 0, atol=1e-3 if fp16 else 0)
    # No leftovers from the simulated crash are mistaken for a checkpoint.
    assert (root / "s1_0" / "latest").read_text() == "final"
    assert sorted(os.listdir(root / "s1_0" / "global_step3")) == sorted(
        ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
         "zero_pp_rank_1_mp_rank_00_optim_states.pt"])


def _check_zero_to_fp32_cli(resumed, tmp_path, capsys):
    from ds_zero.utils.zero_to_fp32 import main

    root, _ = resumed
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "checkpoint_dir" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="latest"):
        main([str(tmp_path / "nope"), str(tmp_path / "x.safetensors")])
    # The real entry point, as a process.
    out = tmp_path / "cli.safetensors"
    done = subprocess.run([sys.executable, "-m", "ds_zero.utils.zero_to_fp32", str(root / "s3_0"), str(out)],
                          capture_output=True, text=True, check=True)
    assert "wrote" in done.stdout and out.exists()
