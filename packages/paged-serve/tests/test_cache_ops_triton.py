"""Triton reshape_and_cache / copy_blocks vs the torch reference; swap_blocks across devices."""

from __future__ import annotations

import pytest
import torch
from paged_serve import ops
from paged_serve.ops import reference


@pytest.mark.parametrize("head_size,block_size,dtype", [(80, 8, torch.bfloat16), (128, 32, torch.float32)])
def test_triton_reshape_and_cache_matches_reference(monkeypatch, device, head_size, block_size, dtype):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    num_blocks, heads = 6, 2
    key = torch.randn(7, heads, head_size).to(device, dtype)
    value = torch.randn(7, heads, head_size).to(device, dtype)
    slots = torch.randperm(num_blocks * block_size)[:7].to(device)
    slots[3] = -1  # padding token
    shape = (num_blocks, block_size, heads, head_size)
    caches = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(4)]
    ops.reshape_and_cache(key, value, caches[0], caches[1], slots)
    reference.reshape_and_cache(key, value, caches[2], caches[3], slots)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    assert int((~caches[0].isnan()).all(-1).all(-1).sum()) == 6  # six slots written, padding skipped


def test_triton_copy_blocks_matches_reference(monkeypatch, device):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    caches = [torch.randn(8, 16, 2, 96, device=device) for _ in range(4)]  # two layers of key and value caches
    expected = [c.clone() for c in caches]
    mapping = torch.tensor([[0, 5], [3, 1], [3, 7]])
    ops.copy_blocks(caches[:2], caches[2:], mapping)
    reference.copy_blocks(expected[:2], expected[2:], mapping)
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)
    assert torch.equal(caches[0][7], caches[0][3]) and not torch.equal(caches[0][6], caches[0][3])


@pytest.mark.gpu(1)
def test_cache_ops_compiled_cuda_and_swap():
    dtype, block_size, heads, head_size = torch.bfloat16, 16, 8, 128
    key = torch.randn(300, heads, head_size, device="cuda", dtype=dtype)
    value = torch.randn(300, heads, head_size, device="cuda", dtype=dtype)
    slots = torch.randperm(64 * block_size, device="cuda")[:300]
    kc, vc = (torch.zeros(64, block_size, heads, head_size, device="cuda", dtype=dtype) for _ in range(2))
    rk, rv = kc.clone(), vc.clone()
    ops.reshape_and_cache(key, value, kc, vc, slots)
    reference.reshape_and_cache(key, value, rk, rv, slots)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    mapping = torch.tensor([[1, 2], [10, 40]])
    ops.copy_blocks([kc], [vc], mapping)
    reference.copy_blocks([rk], [rv], mapping)
    assert torch.equal(kc, rk) and torch.equal(vc, rv)
    cpu = torch.zeros(8, block_size, heads, head_size, dtype=dtype)
    ops.swap_blocks(kc, cpu, torch.tensor([[10, 3], [2, 0]]))
    torch.cuda.synchronize()
    assert torch.equal(cpu[3], kc[10].cpu()) and torch.equal(cpu[0], kc[2].cpu())
    back = torch.zeros_like(kc)
    ops.swap_blocks(cpu, back, torch.tensor([[3, 5]]))
    torch.cuda.synchronize()
    assert torch.equal(back[5], kc[10])
