"""``deepspeed.utils``' ``safe_get_*`` / ``safe_set_*`` (``deepspeed/utils/tensor_fragment.py``; DeepSpeed's
``tests/unit/runtime/zero/test_zero_tensor_fragment.py`` reads parameters and Adam's moments this way after steps)
side by side with DeepSpeed on the same JSON (2 gloo ranks, ZeRO stages 1-3): after two steps every parameter's
full fp32 master copy and its ``exp_avg`` / ``exp_avg_sq`` equal DeepSpeed's; this rank's fragments put together
over the ranks give the full tensor; ``safe_set_full_*`` writes what ``safe_get_full_*`` then reads; stage 0 in fp32
gives None, as DeepSpeed's."""

import importlib.util
import pathlib

import pytest
import torch
import torch.distributed as dist

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

pytest.importorskip("deepspeed")
STEPS = 2


def _read(utils, engine):
    out = {}
    for name, p in engine.module.named_parameters():
        out[(name, "fp32")] = utils.safe_get_full_fp32_param(p)
        for key in ("exp_avg", "exp_avg_sq"):
            out[(name, key)] = utils.safe_get_full_optimizer_state(p, key)
    return out


def _pieces_make_the_whole(utils, engine, stage, world) -> None:
    for _, p in engine.module.named_parameters():
        full = utils.safe_get_full_fp32_param(p)
        local = utils.safe_get_local_fp32_param(p).reshape(-1)
        sizes = [None] * world
        dist.all_gather_object(sizes, local.numel())
        padded = torch.zeros(max(sizes))
        padded[:local.numel()] = local
        gathered = [torch.empty(max(sizes)) for _ in range(world)]
        dist.all_gather(gathered, padded)
        parts = [g[:n] for g, n in zip(gathered, sizes)]
        assert torch.equal(torch.cat(parts)[:full.numel()], full.reshape(-1)), stage


def _run(rank, world):
    with lib.one_thread():
        import deepspeed
        import deepspeed.ops
        import deepspeed.utils
        import ds_zero
        import ds_zero.utils

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        x, y = lib.make_data(STEPS, 4 * world)
        results = {}
        for stage in (0, 1, 2, 3):
            reads = {}
            for impl, init, utils in (("deepspeed", deepspeed.initialize, deepspeed.utils),
                                      ("ds_zero", ds_zero.initialize, ds_zero.utils)):
                model = lib.make_model()
                cfg = lib.base_config(stage, world)
                engine, *_ = init(model=model, model_parameters=model.parameters(), config=cfg)
                lib.train_ds(engine, x, y, rank, world, 4, 1)
                reads[impl] = _read(utils, engine)
                if impl == "ds_zero" and stage:
                    _pieces_make_the_whole(utils, engine, stage, world)
                    name, p = next(iter(engine.module.named_parameters()))
                    before = utils.safe_get_full_fp32_param(p)
                    utils.safe_set_full_fp32_param(p, torch.full_like(before, 0.5))
                    utils.safe_set_full_optimizer_state(p, torch.zeros_like(before), "exp_avg")
                    assert torch.equal(utils.safe_get_full_fp32_param(p), torch.full_like(before, 0.5))
                    assert torch.equal(utils.safe_get_full_optimizer_state(p, "exp_avg"), torch.zeros_like(before))
                    with pytest.raises(KeyError, match="'momentum_buffer' not found"):
                        utils.safe_get_full_optimizer_state(p, "momentum_buffer")
                    engine.destroy()
            results[stage] = reads
        return results


def test_full_fp32_params_and_adam_states_are_deepspeeds():
    for rank, results in enumerate(run_ranks(_run, 2, timeout=420, fresh=True)):
        for stage, reads in results.items():
            theirs, ours = reads["deepspeed"], reads["ds_zero"]
            assert theirs.keys() == ours.keys()
            for key, want in theirs.items():
                got = ours[key]
                if stage == 0:
                    assert want is None and got is None, (stage, key)
                    continue
                assert got is not None and got.shape == want.shape, (rank, stage, key)
                torch.testing.assert_close(got, want.cpu(), rtol=1e-5, atol=1e-6,
                                           msg=lambda m, k=key, s=stage, r=rank: f"rank {r} stage {s} {k}: {m}")
