"""The engine: every ZeRO stage (0-3) in fp32 reproduces a single-process torch run at world 2 and 4,
with gradient accumulation, overlap_comm and clipping; the batch triangle and dataloader are DeepSpeed's."""

import importlib.util
import math
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS = 6


def _fp32_cases(rank, world):
    from ds_zero.runtime.zero import reduce_scatter

    # World 2 takes gloo's fast path (all-reduce the buckets), world 4 the owner-only collectives
    # (reduce_scatter / reduce to owner) that nccl uses, so both are held to the torch reference.
    reduce_scatter.OWNER_ONLY_COLLECTIVES_ON_GLOO = world == 4
    try:
        with lib.one_thread():
            return _fp32_cases_body(rank, world)
    finally:
        reduce_scatter.OWNER_ONLY_COLLECTIVES_ON_GLOO = False


def _fp32_cases_body(rank, world):
    import ds_zero

    out = {}
    data = torch.utils.data.TensorDataset(torch.randn(40, lib.IN), torch.randn(40, lib.OUT))
    engine, opt, loader, sched = ds_zero.initialize(model=lib.make_model(), training_data=data,
                                                    config={"train_batch_size": 6 * world,
                                                            "gradient_accumulation_steps": 3,
                                                            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    boundaries = []
    for _ in range(6):
        boundaries.append(engine.is_gradient_accumulation_boundary())
        engine.micro_steps += 1
    out["batching"] = (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                       engine.gradient_accumulation_steps(), len(next(iter(loader))[0]), len(loader), boundaries,
                       opt is engine.optimizer, sched)
    engine.destroy()
    for stage in (0, 1, 2, 3):
        # World 4 runs only the richer variant: four ranks share two cores.
        variants = ((1, False, 0.0), (2, True, 0.05)) if world == 2 else ((2, True, 0.05),)
        for gas, overlap, clip in variants:
            micro = 2
            x, y = lib.make_data(STEPS, micro * gas * world)
            extra = {"gradient_clipping": clip} if clip else {}
            cfg = lib.base_config(stage, world, micro=micro, gas=gas, **extra)
            cfg["zero_optimization"]["overlap_comm"] = overlap
            model = lib.make_model()
            engine, *_ = ds_zero.initialize(model=model, config=cfg)
            losses = lib.train_ds(engine, x, y, rank, world, micro, gas)
            out[(stage, gas, clip)] = (losses, lib.full_params(engine))
            engine.destroy()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_zero_stages_match_single_process_torch(world):
    results = run_ranks(_fp32_cases, world, timeout=240)
    batching = results[0].pop("batching")
    for r in results[1:]:
        r.pop("batching")
    assert batching == (6 * world, 2, 3, 2, math.ceil(math.ceil(40 / world) / 2),
                        [False, False, True, False, False, True], True, None)
    for (stage, gas, clip), (losses, params) in results[0].items():
        x, y = lib.make_data(STEPS, 2 * gas * world)
        ref = lib.make_model()
        ref_losses = lib.train_reference(ref, x, y, clip=clip)
        losses = lib.mean_over_ranks([r[(stage, gas, clip)][0] for r in results])
        assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), (stage, gas, clip)
        for name, p in ref.named_parameters():
            torch.testing.assert_close(params[name], p.detach(), rtol=1e-4, atol=1e-5, msg=f"{stage} {name}")
        # Every rank ends with the same full parameters.
        for other in results[1:]:
            for name in params:
                torch.testing.assert_close(other[(stage, gas, clip)][1][name], params[name], rtol=0, atol=0)
        # Sanity: training moved the weights, so the comparison is not vacuous.
        assert not torch.allclose(params["head.weight"], lib.make_model().head.weight.detach())


COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor")
CAPPED = 64  # bytes per rank per all-gather piece, for the gloo cap case: 16 fp32 elements
DEFAULTS_STEPS = 3


def _defaults_cases(rank, world):
    """Stages 1-2 on DeepSpeed's default zero_optimization (only the stage: 5e8-element buckets, no overlap_comm),
    with its default clipping; stages 1 and 3 again with gloo's all-gather piece cap lowered to ``CAPPED`` bytes.
    Every collective of each step, with the tensors it writes (data pointer, elements)."""
    import ds_zero
    import torch.distributed as dist
    from ds_zero.runtime.zero import partition_parameters

    out = {}
    x, y = lib.make_data(DEFAULTS_STEPS, 2 * world)
    real = {name: getattr(dist, name) for name in COLLECTIVES}
    real_cap = partition_parameters.GLOO_ALLGATHER_PIECE_BYTES
    for stage, cap in ((1, None), (2, None), (1, CAPPED), (3, CAPPED)):
        cfg = lib.base_config(stage, world, micro=2, gradient_clipping=1.0)
        cfg["zero_optimization"] = {"stage": stage, **({"stage3_param_persistence_threshold": 0} if stage == 3 else {})}
        engine, *_ = ds_zero.initialize(model=lib.make_model(), config=cfg)
        flat = engine.optimizer.flat_groups[0] if stage < 3 else torch.empty(0)
        calls = []

        def record(name, *a, calls=calls, **k):
            written = a[0] if a else k.get("output_tensor", k.get("tensor_list", k.get("tensor")))
            written = written if isinstance(written, list) else [written]
            calls.append((name, [(t.data_ptr(), t.numel()) for t in written]))
            return real[name](*a, **k)

        for name in COLLECTIVES:
            setattr(dist, name, lambda *a, name=name, **k: record(name, *a, **k))
        partition_parameters.GLOO_ALLGATHER_PIECE_BYTES = cap or real_cap
        try:
            with lib.one_thread():
                losses = lib.train_ds(engine, x, y, rank, world, 2, 1)
        finally:
            partition_parameters.GLOO_ALLGATHER_PIECE_BYTES = real_cap
            for name, fn in real.items():
                setattr(dist, name, fn)
        out[stage, cap] = (losses, lib.full_params(engine), calls, flat.data_ptr(), flat.numel(), flat.element_size())
        engine.destroy()
    return out


def test_stages_1_and_2_on_deepspeed_defaults_gather_in_place():
    """One gradient bucket, and the updated partitions gathered straight into the flat parameter buffer, as
    DeepSpeed's ``all_gather_dp_groups``: no copy of the gathered parameters. On gloo every all-gather (ZeRO-3's
    too) goes in equal pieces of at most ``GLOO_ALLGATHER_PIECE_BYTES`` per rank (gloo's slows down past ~12 MiB)."""
    world = 2
    results = run_ranks(_defaults_cases, world, timeout=240)
    x, y = lib.make_data(DEFAULTS_STEPS, 2 * world)
    for stage, cap in results[0]:
        ref = lib.make_model()
        ref_losses = lib.train_reference(ref, x, y, clip=1.0)
        losses = lib.mean_over_ranks([r[stage, cap][0] for r in results])
        assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6), (stage, cap)
        for name, p in ref.named_parameters():
            torch.testing.assert_close(results[0][stage, cap][1][name], p.detach(), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(results[1][stage, cap][1][name], results[0][stage, cap][1][name], rtol=0, atol=0)
        for r in results:
            _, _, calls, ptr, numel, size = r[stage, cap]
            if stage == 3:  # each coalesced gather of parameter chunks, in pieces of at most the cap
                pieces = [n for name, ps in calls if name.startswith("all_gather") for _, n in ps]
                assert pieces and max(pieces) * 4 <= cap
                continue
            # per step: the gradients' all-reduce (gloo), the norm's, then the gather
            gathers = [c for c in calls if c[0] not in ("all_reduce",)]
            assert [name for name, _ in calls if name == "all_reduce"] == ["all_reduce"] * 2 * DEFAULTS_STEPS
            if cap is None:
                assert gathers == [("all_gather_into_tensor", [(ptr, numel)])] * DEFAULTS_STEPS, stage
                continue
            psize = numel // world
            count = -(-psize * size // cap)
            assert len(gathers) == count * DEFAULTS_STEPS
            written = set()
            for name, pieces in gathers:
                assert name == "all_gather" and len(pieces) == world
                for p, n in pieces:
                    assert n * size <= cap and ptr <= p and p + n * size <= ptr + numel * size
                    written.update(range(p, p + n * size, size))
            assert len(written) == numel  # every element of the flat buffer, in place
