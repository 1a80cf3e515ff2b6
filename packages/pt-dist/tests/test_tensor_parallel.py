"""Tensor parallelism (``pt_dist.tensor.parallel``) next to torch's ``torch.distributed.tensor.parallel`` in the
same 2 ranks, after torch's test/distributed/tensor/parallel/test_tp_examples.py (DistTensorParallelExampleTest:
an MLP and a Llama-like transformer block under ``parallelize_module``, with and without sequence parallelism,
``loss_parallel``): a tiny Llama block (row-sharded embedding, RMSNorm under ``SequenceParallel``, RoPE, causal
attention, SwiGLU MLP, vocab-parallel cross entropy) built here, the same weights and plan on both, and the same
model unsharded. Losses and every gradient must match torch's and the unsharded model's; the parameters'
placements must be torch's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
from ptdist_testutil import leave  # noqa: E402
from test_device_mesh import _both_worlds  # noqa: E402

VOCAB, DIM, HEADS, SEQ = 16, 8, 4, 6


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x, *, cos, sin):
        b, s, _ = x.shape  # -1 heads: all of them unsharded, this rank's under tensor parallelism
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))  # RoPE
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(dim), Attention(dim, heads)
        self.ffn_norm, self.feed_forward = RMSNorm(dim), FeedForward(dim)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos=cos, sin=sin)
        return x + self.feed_forward(self.ffn_norm(x))


class TinyLlama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layer = Block(DIM, HEADS)
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        angle = torch.arange(SEQ)[:, None] * torch.arange(DIM // HEADS)[None] * 0.3
        self.register_buffer("cos", angle.cos()[:, None], persistent=False)
        self.register_buffer("sin", angle.sin()[:, None], persistent=False)

    def forward(self, ids):
        return self.output(self.norm(self.layer(self.tok_embeddings(ids), self.cos, self.sin)))


def _plan(api, placements, sequence_parallel: bool, local_attention: bool) -> dict:
    """torchtitan's Llama plan. ``local_attention``: q/k/v come out as this rank's heads (plain tensors, as
    torchtitan and pytorch/examples' llama2 do); otherwise attention runs on DTensors sharded by head."""
    Replicate, Shard = placements.Replicate, placements.Shard
    R, seq = Replicate(), Shard(1)
    local = local_attention
    plan = {
        "layer.attention": api.PrepareModuleInput(
            input_layouts=(seq if sequence_parallel else R,), desired_input_layouts=(R,),
            input_kwarg_layouts={"cos": R, "sin": R}, desired_input_kwarg_layouts={"cos": R, "sin": R},
            use_local_output=local),
        "layer.attention.wq": api.ColwiseParallel(use_local_output=local),
        "layer.attention.wk": api.ColwiseParallel(use_local_output=local),
        "layer.attention.wv": api.ColwiseParallel(use_local_output=local),
        "layer.feed_forward.w1": api.ColwiseParallel(),
        "layer.feed_forward.w3": api.ColwiseParallel(),
    }
    if sequence_parallel:
        plan.update({
            "tok_embeddings": api.RowwiseParallel(input_layouts=R, output_layouts=seq),
            "layer.attention_norm": api.SequenceParallel(), "layer.ffn_norm": api.SequenceParallel(),
            "norm": api.SequenceParallel(),
            "layer.attention.wo": api.RowwiseParallel(output_layouts=seq),
            "layer.feed_forward": api.PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(R,)),
            "layer.feed_forward.w2": api.RowwiseParallel(output_layouts=seq),
            "output": api.ColwiseParallel(input_layouts=seq, use_local_output=False),
        })
    else:
        plan.update({"tok_embeddings": api.RowwiseParallel(input_layouts=R),
                     "layer.attention.wo": api.RowwiseParallel(), "layer.feed_forward.w2": api.RowwiseParallel(),
                     "output": api.ColwiseParallel(use_local_output=False)})
    return plan


def _grads(model) -> dict:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters()}


def _train(model, api, steps: int = 2):
    """Two SGD steps of vocab-parallel cross entropy: (losses, gradients of each step, the parameters' placements)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(step))
        with api.loss_parallel():
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten(0, 1))
            loss.backward()
        losses.append(loss.full_tensor().item())
        grads.append(_grads(model))
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: tuple(str(p) for p in getattr(q, "placements", ("plain",)))
                           for n, q in model.named_parameters()}


def _unsharded(steps: int = 2):
    torch.manual_seed(0)
    model = TinyLlama()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    for step in range(steps):
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(step))
        loss = F.cross_entropy(model(ids).flatten(0, 1), ids.roll(-1, 1).flatten(0, 1))
        loss.backward()
        losses.append(loss.item())
        grads.append(_grads(model))
        opt.step()
        opt.zero_grad()
    return losses, grads


def _ours_and_torchs(rank, world, sequence_parallel, local_attention, with_torch, backend="tcp"):
    import pt_dist.tensor as ptt
    import pt_dist.tensor.parallel as ours
    import torch.distributed.tensor as tt
    import torch.distributed.tensor.parallel as theirs
    from pt_dist.device_mesh import init_device_mesh
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):  # the aten ops that reach a DTensor
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    _both_worlds(rank, world, backend)
    try:
        torch.manual_seed(0)
        model = TinyLlama()
        ours.parallelize_module(model, init_device_mesh("cpu", (world,)),
                                _plan(ours, ptt, sequence_parallel, local_attention))
        with Seen() as seen:
            got = _train(model, ours)
        want = None
        if with_torch:
            torch.manual_seed(0)
            model = TinyLlama()
            theirs.parallelize_module(model, torch_init_device_mesh("cpu", (world,)),
                                      _plan(theirs, tt, sequence_parallel, local_attention))
            want = _train(model, theirs)
        return got, want, _unsharded(), seen.ops
    finally:
        leave()
        if dist.is_initialized():  # (pt_dist's gloo adapter destroyed torch's default group with its own)
            dist.destroy_process_group()


def _close(a: dict, b: dict) -> list[str]:
    return [n for n in a if not torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-6)]


@pytest.mark.parametrize(("sequence_parallel", "backend"), [(True, "tcp"), (False, "tcp"), (True, "gloo")],
                         ids=["sequence_parallel", "tp_only", "sequence_parallel-gloo_adapter"])
def test_llama_block_matches_torch_tp_and_the_unsharded_model(sequence_parallel, backend):
    for got, want, plain, _ in run_ranks(_ours_and_torchs, 2, sequence_parallel, True, True, backend,
                                         backend=None, timeout=240):
        (losses, grads, placements), (t_losses, t_grads, t_placements) = got, want
        assert placements == t_placements
        assert placements["tok_embeddings.weight"] == ("S(0)",)  # the row-sharded table
        assert torch.allclose(torch.tensor(losses), torch.tensor(t_losses), rtol=1e-5)
        assert torch.allclose(torch.tensor(losses), torch.tensor(plain[0]), rtol=1e-5)
        assert losses[0] != losses[1]  # the step changed the parameters: the second step's gradients are new
        for step in range(2):
            assert _close(grads[step], t_grads[step]) == [], step
            assert _close(grads[step], plain[1][step]) == [], step


def test_attention_on_dtensors_matches_the_unsharded_model():
    """q/k/v as head-sharded DTensors: RoPE's element-wise ops, cat and slices, the views and transposes of the
    sharded head dim and CPU's flash attention run as DTensor ops (torch 2.15 has no rule for that kernel, so
    the comparison is with the unsharded model)."""
    for got, _, plain, seen in run_ranks(_ours_and_torchs, 2, True, False, False, backend=None, timeout=240):
        losses, grads, placements = got
        assert "_scaled_dot_product_flash_attention_for_cpu" in seen
        assert "_scaled_dot_product_flash_attention_for_cpu_backward" in seen
        assert placements["layer.attention.wq.weight"] == ("S(0)",)
        assert torch.allclose(torch.tensor(losses), torch.tensor(plain[0]), rtol=1e-5)
        for step in range(2):
            assert _close(grads[step], plain[1][step]) == [], step


def test_styles_repr_and_bad_input_as_torchs():
    import pt_dist.tensor as ptt
    import pt_dist.tensor.parallel as ours
    import torch.distributed.tensor as tt
    import torch.distributed.tensor.parallel as theirs

    def styles(api, pl):
        return [api.ColwiseParallel(), api.RowwiseParallel(input_layouts=pl.Replicate(), use_local_output=False),
                api.SequenceParallel(sequence_dim=0), api.PrepareModuleInput(
                    input_layouts=(pl.Shard(0), None), desired_input_layouts=(pl.Replicate(), None)),
                api.PrepareModuleOutput(output_layouts=pl.Shard(0), desired_output_layouts=pl.Replicate()),
                api.PrepareModuleInputOutput(input_layouts=pl.Shard(0), desired_input_layouts=pl.Replicate(),
                                             output_layouts=pl.Replicate(), desired_output_layouts=pl.Shard(1))]

    assert [repr(s) for s in styles(ours, ptt)] == [repr(s) for s in styles(theirs, tt)]
    for api, pl in ((ours, ptt), (theirs, tt)):
        with pytest.raises(NotImplementedError, match="only support nn.Linear and nn.Embedding"):
            api.ColwiseParallel()._apply(nn.Conv1d(2, 2, 1), None)
        with pytest.raises(AssertionError, match="same length"):
            api.PrepareModuleInput(input_layouts=(pl.Shard(0),), desired_input_layouts=(pl.Shard(0), None))
        with pytest.raises(TypeError, match="parallelize_plan"):
            api.parallelize_module(nn.Linear(2, 2), object(), parallelize_plan=[api.ColwiseParallel()])
        with pytest.warns(UserWarning, match="No parallelize_plan"):
            api.parallelize_module(nn.Linear(2, 2), object())


def test_deprecated_tensor_path_is_pt_dist_tensor():
    import pt_dist._tensor as old
    import pt_dist.device_mesh
    import pt_dist.tensor as new
    from pt_dist._tensor.device_mesh import init_device_mesh
    from pt_dist._tensor.placement_types import Shard

    assert (old.DTensor, old.Shard, old.Replicate, old.distribute_tensor) == (
        new.DTensor, new.Shard, new.Replicate, new.distribute_tensor)
    assert init_device_mesh is pt_dist.device_mesh.init_device_mesh and Shard is new.Shard
