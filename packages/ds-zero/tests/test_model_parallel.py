"""Data parallelism as a subgroup: a 2 x 2 layout (model-parallel size 2, data-parallel size 2) through an mpu.

Model-parallel rank m holds model m (its params marked ``model_parallel``: each mp rank has a different
piece), data-parallel ranks hold replicas. Then every ZeRO stage must: broadcast the initial weights
inside each data-parallel group (from that group's first global rank, not rank 0), clip with the norm
over both models (summed across the model-parallel group), skip a step on every rank when one model
overflows, and let ``GatheredParameters(modifier_rank=...)`` name a rank of the data-parallel group.
The reference trains both models jointly on one process.
"""

import importlib.util
import pathlib

import pytest
import torch

from harness import run_ranks

_spec = importlib.util.spec_from_file_location("zero_testlib", pathlib.Path(__file__).with_name("zero_testlib.py"))
lib = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lib)

STEPS, MICRO, CLIP = 4, 2, 0.2


class GridMPU:
    """Megatron's parallel-state interface over ranks laid out [dp][mp]: mp groups {0,1},{2,3}; dp {0,2},{1,3}."""

    def __init__(self, world, mp=2):
        import torch.distributed as dist

        rank = dist.get_rank()
        self.mp_size, self.dp_size = mp, world // mp
        self.mp_rank, self.dp_rank = rank % mp, rank // mp
        for d in range(self.dp_size):  # every rank creates every group, in the same order
            g = dist.new_group([d * mp + m for m in range(mp)])
            if d == self.dp_rank:
                self.mp_group = g
        for m in range(mp):
            g = dist.new_group([d * mp + m for d in range(self.dp_size)])
            if m == self.mp_rank:
                self.dp_group = g

    def get_model_parallel_group(self):
        return self.mp_group

    def get_model_parallel_rank(self):
        return self.mp_rank

    def get_model_parallel_world_size(self):
        return self.mp_size

    def get_data_parallel_group(self):
        return self.dp_group

    def get_data_parallel_rank(self):
        return self.dp_rank

    def get_data_parallel_world_size(self):
        return self.dp_size


def _model_for(mp_rank, seed):
    model = lib.make_model(seed=seed)
    for p in model.parameters():
        p.model_parallel = True
    return model


def _data():
    # per model: STEPS global batches of 2 * MICRO
    return [lib.make_data(STEPS, 2 * MICRO, seed=10 + m) for m in range(2)]


def _grid_cases(rank, world):
    with lib.one_thread():
        return _grid_cases_body(rank, world)


def _grid_cases_body(rank, world):
    import ds_zero
    from ds_zero.zero import GatheredParameters

    mpu = GridMPU(world)
    (x, y) = _data()[mpu.mp_rank]
    out = {}
    for stage in (0, 1, 2, 3):
        cfg = lib.base_config(stage, 2, micro=MICRO, gradient_clipping=CLIP)
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
        # Different weights on the data-parallel replica: the engine must broadcast inside the dp group.
        seed = mpu.mp_rank if mpu.dp_rank == 0 else 100 + rank
        engine, *_ = ds_zero.initialize(model=_model_for(mpu.mp_rank, seed), config=cfg, mpu=mpu)
        losses, norms = [], []
        for s in range(STEPS):
            xb, yb = lib.rank_batches(x, y, s, mpu.dp_rank, 2, MICRO, 1)[0]
            loss = torch.nn.functional.mse_loss(engine(xb), yb)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            # the optimizer's: at stage 0 in fp32 the engine answers None, as DeepSpeed's (test_engine_attributes)
            norms.append(engine.optimizer.get_global_grad_norm())
        result = {"losses": losses, "norms": norms, "params": lib.full_params(engine)}
        if stage == 3:
            bias = engine.module.head.bias
            with GatheredParameters([bias], modifier_rank=1):
                if mpu.dp_rank == 1:  # data-parallel rank 1 (global rank 2 or 3)
                    bias.data.fill_(float(10 + mpu.mp_rank))
            with GatheredParameters([bias]):
                result["modified"] = bias.detach().clone()
        engine.destroy()
        out[stage] = result
    # fp16: only model 1 sees an inf at step 1; every rank of both models skips that step.
    cfg = lib.base_config(1, 2, micro=MICRO)
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    engine, *_ = ds_zero.initialize(model=_model_for(mpu.mp_rank, mpu.mp_rank), config=cfg, mpu=mpu)
    for s in range(3):
        xb, yb = lib.rank_batches(x, y, s, mpu.dp_rank, 2, MICRO, 1)[0]
        xb = xb.half()
        if s == 1 and mpu.mp_rank == 1 and mpu.dp_rank == 0:
            xb[0, 0] = float("inf")
        engine.backward(torch.nn.functional.mse_loss(engine(xb).float(), yb))
        engine.step()
    out["overflow"] = (engine.skipped_steps, engine.optimizer.loss_scale)
    engine.destroy()
    return out


def _reference():
    """Both models, one optimizer, clipping over the union of their parameters."""
    models = [lib.make_model(seed=m) for m in range(2)]
    params = [p for m in models for p in m.parameters()]
    optim = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    data = _data()
    losses, norms = [[], []], []
    for s in range(STEPS):
        optim.zero_grad()
        total = 0
        for m, model in enumerate(models):
            x, y = data[m]
            loss = torch.nn.functional.mse_loss(model(x[s]), y[s])
            losses[m].append(loss.item())
            total = total + loss
        total.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, CLIP).item())
        optim.step()
    return models, losses, norms


def test_zero_with_data_parallel_subgroups_in_a_2x2_layout():
    results = run_ranks(_grid_cases, 4, timeout=300)
    models, ref_losses, ref_norms = _reference()
    for stage in (0, 1, 2, 3):
        for rank, r in enumerate(results):
            mp = rank % 2
            res = r[stage]
            assert res["norms"] == pytest.approx(ref_norms, rel=1e-5), (stage, rank)
            pair = [results[d * 2 + mp][stage]["losses"] for d in range(2)]
            assert lib.mean_over_ranks(pair) == pytest.approx(ref_losses[mp], rel=1e-5), (stage, rank)
            for name, p in models[mp].named_parameters():
                torch.testing.assert_close(res["params"][name], p.detach(), rtol=1e-4, atol=1e-6,
                                           msg=f"stage {stage} rank {rank} {name}")
            if stage == 3:
                assert torch.equal(res["modified"], torch.full((lib.OUT,), float(10 + mp)))
    assert max(ref_norms) > CLIP  # clipping is active: the model-parallel norm shapes every update
    assert [r["overflow"][0] for r in results] == [1, 1, 1, 1]
    assert all(r["overflow"][1] == 128.0 for r in results)
