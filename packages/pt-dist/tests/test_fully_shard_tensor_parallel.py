"""FSDP2 over tensor parallelism (2-D: dp 2 x tp 2, 4 ranks) next to torch's ``fully_shard`` +
``parallelize_module`` in the same ranks, after torch's test/distributed/_composable/fsdp/test_fully_shard_training.py
(TestFullyShard2DTraining.test_train_parity_2d_transformer): the tiny Llama block of test_tensor_parallel.py under
torchtitan's sequence-parallel plan on ``mesh["tp"]``, each layer and the root ``fully_shard``-ed on
``mesh["dp"]``, each dp rank its own half of the batch. Losses, every gradient and the parameters after two SGD
steps must match torch's and the unsharded model's on the whole batch."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import leave  # noqa: E402
from test_device_mesh import _both_worlds  # noqa: E402
from test_tensor_parallel import SEQ, VOCAB, TinyLlama, _close, _plan  # noqa: E402

STEPS = 2


def _batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(step))


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train_2d(model, api, dp_rank: int):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(STEPS):
        ids = _batch(step).chunk(2)[dp_rank]
        with api.loss_parallel():
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten(0, 1))
            loss.backward()
        losses.append(_full(loss).item())
        grads.append({n: _full(p.grad).clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    params = {n: _full(p.detach()).clone() for n, p in model.named_parameters()}
    placements = {n: (tuple(str(q) for q in p.placements), p.device_mesh.mesh.tolist())
                  for n, p in model.named_parameters()}
    return losses, grads, params, placements


def _unsharded():
    torch.manual_seed(0)
    model = TinyLlama()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(STEPS):
        ids = _batch(step)
        halves = [F.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten(0, 1)) for x in ids.chunk(2)]
        loss = sum(halves) / 2  # each dp rank's mean loss, averaged by FSDP's gradient division
        loss.backward()
        losses.append([h.item() for h in halves])
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def _apply_2d(model, tp_api, fully_shard, mesh, placements):
    tp_api.parallelize_module(model, mesh["tp"], _plan(tp_api, placements, True, True))
    fully_shard(model.layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def _ours_and_torchs_2d(rank, world):
    import pt_dist.tensor as ptt
    import pt_dist.tensor.parallel as ours
    import torch.distributed.tensor as tt
    import torch.distributed.tensor.parallel as theirs
    from pt_dist.device_mesh import init_device_mesh
    from pt_dist.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    _both_worlds(rank, world, "tcp")
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        dp_rank = mesh.get_local_rank("dp")
        torch.manual_seed(0)
        got = _train_2d(_apply_2d(TinyLlama(), ours, fully_shard, mesh, ptt), ours, dp_rank)
        tmesh = torch_init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        torch.manual_seed(0)
        want = _train_2d(_apply_2d(TinyLlama(), theirs, torch_fully_shard, tmesh, tt), theirs, dp_rank)
        return dp_rank, got, want, _unsharded()
    finally:
        leave()
        dist.destroy_process_group()


def test_fully_shard_over_tp_matches_torch_and_the_unsharded_model_on_4_ranks():
    for rank, (dp_rank, got, want, plain) in enumerate(run_ranks(_ours_and_torchs_2d, 4, backend=None,
                                                                  timeout=300)):
        losses, grads, params, placements = got
        t_losses, t_grads, t_params, t_placements = want
        # torch: (_StridedShard(dim=0, sf=2), Shard(0)) on (dp, tp); pt_dist the same layout as (S(0), S(0)) on (tp, dp)
        assert placements["layer.attention.wq.weight"] == (("S(0)", "S(0)"), [[0, 2], [1, 3]]), placements
        assert t_placements["layer.attention.wq.weight"] == (("_S(0, 2)", "S(0)"), [[0, 1], [2, 3]])
        assert placements["layer.attention.wo.weight"] == (("S(1)", "S(0)"), [[0, 2], [1, 3]])
        assert torch.allclose(torch.tensor(losses), torch.tensor(t_losses), rtol=1e-5)
        assert torch.allclose(torch.tensor(losses), torch.tensor([h[dp_rank] for h in plain[0]]), rtol=1e-5)
        for step in range(2):
            assert _close(grads[step], t_grads[step]) == [], (rank, step)
            assert _close(grads[step], plain[1][step]) == [], (rank, step)
        assert _close(params, t_params) == [] and _close(params, plain[2]) == []
        assert plain[0][0] != plain[0][1]  # the step moved the weights
