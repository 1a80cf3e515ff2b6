"""DeepSpeedEngine methods users reach for beyond the training step, side by side with DeepSpeed on the same JSON
(2 gloo ranks, ZeRO stages 1 and 3): ``get_batch_info``, ``set_train_batch_size`` / ``set_train_micro_batch_size``,
``zero_gather_16bit_weights_on_model_save``, ``zero_offload_optimizer`` / ``zero_offload_param``,
``dataloader_drop_last`` (and the loader ``initialize(training_data=)`` builds with it), ``deepspeed_io`` (the same
samples in the same order per route), ``is_map_style_dataset``, ``save_16bit_model`` (the
file's tensors equal DeepSpeed's after a step; at stage 3 without the gather flag neither saves) and
``load_module_state_dict``."""

import importlib.util
import os
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

pytest.importorskip("deepspeed")


def _plain(v):
    """What a method gave, as plain values (a config section as its class name and fields)."""
    if isinstance(v, (bool, int, float, str, type(None), torch.Tensor)):
        return v
    if isinstance(v, (tuple, list)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return type(v).__name__


def _run(rank, world, root):
    with lib.one_thread():
        import deepspeed
        import deepspeed.ops
        import ds_zero

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        x, y = lib.make_data(1, 4 * world)
        data = torch.utils.data.TensorDataset(torch.randn(10, x.shape[1]), torch.randn(10, y.shape[1]))
        out = {}
        for stage in (1, 3):
            for gather in (False, True):
                if stage == 1 and gather:
                    continue
                for impl, init in (("deepspeed", deepspeed.initialize), ("ds_zero", ds_zero.initialize)):
                    model = lib.make_model()
                    cfg = lib.base_config(stage, world, dataloader_drop_last=True)
                    # no persistent parameters: DeepSpeed's load_module_state_dict leaves their partitions stale,
                    # so its next consolidated save would still read their old values
                    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
                    if gather:
                        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
                    engine, _, loader, _ = init(model=model, model_parameters=model.parameters(), config=cfg,
                                                training_data=data)
                    r = {"batch": tuple(get() for get in engine.get_batch_info()),  # DeepSpeed returns getters
                         "gather": engine.zero_gather_16bit_weights_on_model_save(),
                         "offload": (engine.zero_offload_optimizer(), engine.zero_offload_param()),
                         "drop_last": engine.dataloader_drop_last(), "loader batches": len(loader),
                         "map style": engine.is_map_style_dataset(data),
                         "iterable style": engine.is_iterable_style_dataset(data)}
                    for route in ("train", "eval"):  # this rank's samples, in the order each loader gives them
                        r[f"deepspeed_io {route}"] = torch.cat([b[0] for b in engine.deepspeed_io(data, route=route)])
                    r["deepspeed_io batch 3"] = [len(b[0]) for b in engine.deepspeed_io(data, batch_size=3)]
                    lib.train_ds(engine, x, y, rank, world, 4, 1)
                    save_dir = os.path.join(root, f"{impl}-{stage}-{gather}")
                    r["saved"] = engine.save_16bit_model(save_dir)
                    torch.distributed.barrier()  # rank 0 writes; neither library waits for it
                    if r["saved"]:
                        r["file"] = torch.load(os.path.join(save_dir, "pytorch_model.bin"), weights_only=True)
                        engine.load_module_state_dict({"module": {k: torch.zeros_like(v) for k, v in
                                                                  r["file"].items()}}, fetch_z3_params=stage == 3)
                        saved = engine.save_16bit_model(save_dir, "zeros.bin")
                        torch.distributed.barrier()
                        r["not zeroed"] = saved and sorted(
                            k for k, t in torch.load(os.path.join(save_dir, "zeros.bin"), weights_only=True).items()
                            if t.any())
                    engine.set_train_batch_size(16)
                    r["after set_train_batch_size"] = tuple(get() for get in engine.get_batch_info())
                    engine.set_train_micro_batch_size(2)
                    r["after set_train_micro_batch_size"] = tuple(get() for get in engine.get_batch_info())
                    with pytest.raises(ValueError, match="divisible by micro-batch data parallelism"):
                        engine.set_train_batch_size(7)
                    out[(stage, gather, impl)] = _plain(r)
                    if impl == "ds_zero":
                        engine.destroy()
        return out


def test_engine_methods_answer_as_deepspeeds(tmp_path):
    results = run_ranks(_run, 2, str(tmp_path), timeout=420, fresh=True)
    for rank, out in enumerate(results):
        for (stage, gather, impl), ours in out.items():
            if impl != "ds_zero":
                continue
            theirs = out[(stage, gather, "deepspeed")]
            assert ours.keys() == theirs.keys(), (stage, gather)
            for key, want in theirs.items():
                if key == "file":
                    assert ours[key].keys() == want.keys()
                    for name, t in want.items():
                        assert ours[key][name].dtype == t.dtype, name
                        torch.testing.assert_close(ours[key][name], t, rtol=1e-5, atol=1e-6)
                elif isinstance(want, torch.Tensor):
                    assert torch.equal(ours[key], want), (rank, stage, gather, key)
                else:
                    assert ours[key] == want, (rank, stage, gather, key, ours[key], want)
        assert out[(3, False, "ds_zero")]["saved"] is False and out[(3, True, "ds_zero")]["saved"] is True
        assert out[(1, False, "ds_zero")]["loader batches"] == 1  # 5 samples per rank, micro-batch 4, drop_last
