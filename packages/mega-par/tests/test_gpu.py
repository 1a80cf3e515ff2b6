"""GPU runs (``pytest -m gpu``): the model on CUDA under NCCL matches its CPU run, and TP=2 matches TP=1; the
untagged pipeline p2p pairs activations and gradients by order under NCCL, which ignores tags."""

import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F
from mega_par import parallel_state as ps
from mega_par.models.gpt import GPTModel, get_gpt_layer_local_spec
from mega_par.transformer import TransformerConfig

from harness import run_ranks


def _model():
    cfg = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                            ffn_hidden_size=48, hidden_dropout=0.0, attention_dropout=0.0, normalization="RMSNorm",
                            add_bias_linear=False, gated_linear_unit=True, activation_func=F.silu)
    return GPTModel(cfg, get_gpt_layer_local_spec(), 64, 16, position_embedding_type="rope", seed=3).eval()


def _ids():
    return torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))


def _cuda_loss(rank, world_size, with_cpu_reference):
    torch.backends.cuda.matmul.allow_tf32 = False
    ps.initialize_model_parallel(world_size, 1)
    try:
        model, ids = _model(), _ids()
        with torch.no_grad():
            cpu_loss = model(ids, None, None, labels=ids) if with_cpu_reference else None  # world 1: no collectives
            cuda_loss = model.cuda()(ids.cuda(), labels=ids.cuda()).cpu()
        return cuda_loss, cpu_loss
    finally:
        ps.destroy_model_parallel()


@pytest.mark.gpu(1)
def test_gpt_on_cuda_matches_cpu():
    (cuda_loss, cpu_loss), = run_ranks(_cuda_loss, 1, True, backend="nccl")
    torch.testing.assert_close(cuda_loss, cpu_loss, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu(2)
def test_tp2_gpt_on_cuda_matches_tp1():
    (ref, _), = run_ranks(_cuda_loss, 1, False, backend="nccl")
    for loss, _ in run_ranks(_cuda_loss, 2, False, backend="nccl"):
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)


def _p2p_wraparound(rank, world_size):
    spec = importlib.util.spec_from_file_location("mega_par_gpu_schedules", pathlib.Path(__file__).with_name(
        "test_schedules.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._p2p_wraparound_untagged(rank, world_size)


@pytest.mark.gpu(2)
def test_untagged_p2p_wraparound_on_nccl():
    """pp=2 wrap-around (both neighbours one rank) on NCCL: test_schedules' case, on device tensors."""
    run_ranks(_p2p_wraparound, 2, backend="nccl")
