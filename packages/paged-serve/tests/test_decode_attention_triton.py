"""Triton decode PagedAttention (interpreter on CPU, compiled on CUDA) vs the torch reference and SDPA."""

from __future__ import annotations

import pytest
import torch
from paged_serve import ops
from paged_serve.ops import reference

# A covering subset: every head size, block size, GQA ratio and dtype appears, the interpreter stays fast.
CASES = [
    (64, 16, 1, torch.float32),
    (80, 8, 2, torch.bfloat16),
    (96, 32, 4, torch.float32),
    (128, 16, 8, torch.bfloat16),
    (80, 32, 8, torch.float32),
    (96, 8, 1, torch.bfloat16),
    (128, 8, 2, torch.float32),
    (64, 32, 4, torch.bfloat16),
]


def _tol(dtype):
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _check_decode(kv, num_heads, head_size, dtype, device, sdpa=None):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(len(kv.context_lens_list), num_heads, head_size, generator=gen).to(dtype).to(device)
    out = torch.full_like(q, float("nan"))  # any element the kernel fails to write stays NaN
    scale = head_size**-0.5
    ops.paged_attention(q, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, scale, out=out)
    assert not out.isnan().any()
    want = reference.paged_attention(q, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, scale)
    torch.testing.assert_close(out, want, **_tol(dtype))
    if sdpa is not None:
        for s in range(len(kv.context_lens_list)):
            expect = sdpa(q[s : s + 1].cpu(), kv.keys[s], kv.values[s])[0]
            torch.testing.assert_close(out[s].float().cpu(), expect, **_tol(dtype))
    return out


@pytest.mark.parametrize("head_size,block_size,group,dtype", CASES)
def test_triton_decode_matches_reference_and_sdpa(
    monkeypatch, paged_kv, sdpa, device, head_size, block_size, group, dtype
):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    # one token, exactly one block, one past a boundary, one short of two blocks, three full blocks
    lens = [1, block_size, block_size + 1, 2 * block_size - 1, 3 * block_size]
    kv = paged_kv(lens, block_size, 2, head_size, dtype, device=device, seed=head_size + block_size)
    _check_decode(kv, 2 * group, head_size, dtype, device, sdpa)


def test_triton_decode_uses_block_table(monkeypatch, paged_kv, device):
    """Sanity: the kernel really follows the table; swapping two sequences' tables changes their outputs."""
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    kv = paged_kv([16, 16], 16, 1, 64, torch.float32, device=device)
    q = torch.randn(2, 1, 64, device=device)
    out = ops.paged_attention(q, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens)
    swapped = ops.paged_attention(q, kv.key_cache, kv.value_cache, kv.block_tables.flip(0), kv.context_lens)
    assert not torch.allclose(out, swapped)


@pytest.mark.gpu(1)
@pytest.mark.parametrize("head_size,block_size,group,dtype", CASES)
def test_triton_decode_compiled_cuda(paged_kv, head_size, block_size, group, dtype):
    gen = torch.Generator().manual_seed(0)
    lens = [1, block_size, *torch.randint(2, 1500, (30,), generator=gen).tolist()]
    kv = paged_kv(lens, block_size, 4, head_size, dtype, device="cuda", seed=3)
    _check_decode(kv, 4 * group, head_size, dtype, "cuda")
