"""Checkpoints: save -> load continues the identical loss curve (stages 1-3, fp16 too); crash-safe
writes; zero_to_fp32 (function and CLI) gives a plain fp32 state dict that loads into the torch model."""

import importlib.util
import json
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
        out = tmp_path / f"s{stage}_{int(fp16)}"  # a folder, as DeepSpeed's
        convert_zero_checkpoint_to_fp32_state_dict(root / f"s{stage}_{int(fp16)}", out, tag="final",
                                                   safe_serialization=True)
        assert os.listdir(out) == ["model.safetensors"]
        sd = load_file(str(out / "model.safetensors"))
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
    with pytest.raises(ValueError, match="Unable to find 'latest' file"):  # DeepSpeed's error
        main([str(tmp_path / "nope"), str(tmp_path / "x")])
    # The real entry point, as a process.
    out = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "ds_zero.utils.zero_to_fp32", str(root / "s3_0"), str(out)],
                          capture_output=True, text=True, check=True)
    assert "wrote" in done.stdout and (out / "pytorch_model.bin").exists()


# ---------------------------------------------------------------- DeepSpeed's model-checkpointing page, side by side
PAGE_STEPS = 2


def _page_cases(rank, world, root):
    """DeepSpeed and ds_zero train the same model 2 steps at stages 2 and 3 and save; then every rank saves into a
    folder of its own (HelloDeepSpeed's timestamped run names, taken on each rank a moment apart)."""
    with lib.one_thread():
        import deepspeed
        import deepspeed.ops
        import ds_zero

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        x, y = lib.make_data(PAGE_STEPS, MICRO * world)
        out = {}
        for stage in (2, 3):
            for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
                model = lib.make_model()
                model.body[0].weight.requires_grad_(False)  # a frozen parameter: exclude_frozen_parameters
                engine, *_ = init(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                  config=lib.base_config(stage, world, micro=MICRO))
                out[(impl, stage, "losses")] = lib.train_ds(engine, x, y, rank, world, MICRO, 1)
                engine.save_checkpoint(os.path.join(root, f"{impl}_s{stage}"))
                engine.save_checkpoint(os.path.join(root, f"{impl}_s{stage}_run_at_{rank}"), tag="per_rank")
                if impl == "ds_zero":
                    engine.destroy()
        return out


def _tree(path):
    return sorted(os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs)


def test_checkpointing_page_and_per_rank_folders_as_deepspeed(tmp_path):
    """``zero_to_fp32.py`` and ``zero_to_torch.py`` written beside the tags and run as commands; the page's
    ``get_fp32_state_dict_from_zero_checkpoint`` (``exclude_frozen_parameters``), ``load_state_dict_from_zero_
    checkpoint``, ``convert_zero_checkpoint_to_fp32_state_dict`` into a folder (sharded past ``max_shard_size``,
    safetensors or not) and ``clone_tensors_for_torch_save``: each equal to DeepSpeed's on DeepSpeed's own
    checkpoint of the same run. Ranks that save into different folders each get theirs, laid out as DeepSpeed's."""
    import deepspeed.checkpoint.utils as ds_ckpt_utils
    import deepspeed.utils.zero_to_fp32 as ds_z2f
    import ds_zero
    import ds_zero.utils.zero_to_fp32 as z2f

    root = tmp_path / "page"
    root.mkdir()
    results = run_ranks(_page_cases, 2, str(root), timeout=300, fresh=True)  # DeepSpeed leaves process-wide state
    for r in results:
        for stage in (2, 3):
            assert r[("ds_zero", stage, "losses")] == pytest.approx(r[("deepspeed", stage, "losses")], rel=1e-5)
    for stage in (2, 3):
        theirs, ours = root / f"deepspeed_s{stage}", root / f"ds_zero_s{stage}"
        top = {f for f in os.listdir(theirs) if not os.path.isdir(theirs / f)}
        assert top == {f for f in os.listdir(ours) if not os.path.isdir(ours / f)} == {
            "latest", "zero_to_fp32.py", "zero_to_torch.py"}
        assert all(os.access(ours / f, os.X_OK) for f in ("zero_to_fp32.py", "zero_to_torch.py"))
        ref = ds_z2f.get_fp32_state_dict_from_zero_checkpoint(str(theirs))
        got = z2f.get_fp32_state_dict_from_zero_checkpoint(str(ours))
        assert got.keys() == ref.keys()
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-7)
        kept = ds_z2f.get_fp32_state_dict_from_zero_checkpoint(str(theirs), exclude_frozen_parameters=True)
        assert "body.0.weight" not in kept
        assert z2f.get_fp32_state_dict_from_zero_checkpoint(str(ours), exclude_frozen_parameters=True).keys() \
            == kept.keys()
        # the scripts the page runs, as commands in the checkpoint folder
        for script, extra in (("zero_to_fp32.py", []), ("zero_to_torch.py", ["--dtype", "bf16"])):
            for d, name in ((theirs, "theirs"), (ours, "ours")):
                subprocess.run([sys.executable, script, ".", f"out_{script}_{name}", *extra], cwd=d, check=True,
                               capture_output=True, text=True)
            a = torch.load(theirs / f"out_{script}_theirs" / "pytorch_model.bin")
            b = torch.load(ours / f"out_{script}_ours" / "pytorch_model.bin")
            assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype for k in a)
            for k in a:
                torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-7)
        # the folder form: sharded at 1 KB, with DeepSpeed's (Hugging Face's) shard names and index
        for safe in (False, True):
            ds_z2f.convert_zero_checkpoint_to_fp32_state_dict(str(theirs), str(tmp_path / f"t{stage}{safe}"),
                                                              max_shard_size="1KB", safe_serialization=safe)
            z2f.convert_zero_checkpoint_to_fp32_state_dict(str(ours), str(tmp_path / f"o{stage}{safe}"),
                                                           max_shard_size="1KB", safe_serialization=safe)
            assert sorted(os.listdir(tmp_path / f"o{stage}{safe}")) == sorted(os.listdir(tmp_path / f"t{stage}{safe}"))
            index = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
            t_index = json.loads((tmp_path / f"t{stage}{safe}" / index).read_text())
            o_index = json.loads((tmp_path / f"o{stage}{safe}" / index).read_text())
            assert o_index["weight_map"] == t_index["weight_map"] and len(set(t_index["weight_map"].values())) > 1
            assert o_index["metadata"]["total_size"] == t_index["metadata"]["total_size"]
        model_theirs = ds_z2f.load_state_dict_from_zero_checkpoint(lib.make_model(seed=3), str(theirs))
        model_ours = z2f.load_state_dict_from_zero_checkpoint(lib.make_model(seed=3), str(ours))
        for p, q in zip(model_theirs.parameters(), model_ours.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)
        # ranks naming their own folders: each folder holds what its rank wrote, as DeepSpeed's
        for rank in (0, 1):
            assert _tree(root / f"ds_zero_s{stage}_run_at_{rank}") == _tree(root / f"deepspeed_s{stage}_run_at_{rank}")
        assert "per_rank/zero_pp_rank_1_mp_rank_00_optim_states.pt" in _tree(root / f"ds_zero_s{stage}_run_at_1")
    # clone_tensors_for_torch_save: views of one flat buffer come back owning their own storage
    flat = torch.arange(12.0)
    nested = {"a": flat[:3], "b": [flat[3:5], (flat[5:], 7)], "c": "text"}
    for fn in (ds_ckpt_utils.clone_tensors_for_torch_save, ds_zero.checkpoint.utils.clone_tensors_for_torch_save):
        cloned = fn(nested)
        assert cloned["a"].untyped_storage().nbytes() == 12 and cloned["b"][1][1] == 7 and cloned["c"] == "text"
        assert torch.equal(cloned["b"][1][0], flat[5:]) and cloned["b"][1][0].data_ptr() != flat[5:].data_ptr()
        assert fn(flat, device="meta").device.type == "meta"
