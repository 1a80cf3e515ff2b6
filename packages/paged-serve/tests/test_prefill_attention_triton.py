"""Triton prefill / chunked-prefill attention over the paged cache vs the torch reference and SDPA."""

from __future__ import annotations

import pytest
import torch
from paged_serve import ops
from paged_serve.ops import reference

CASES = [
    (64, 8, 1, torch.float32),
    (80, 16, 2, torch.bfloat16),
    (96, 32, 4, torch.float32),
    (128, 16, 8, torch.bfloat16),
    (96, 8, 8, torch.float32),
]


def _tol(dtype):
    # bf16: P is rounded to bf16 before the P @ V tensor-core product, as FlashAttention does
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)


def _check_prefill(kv, q_lens, num_heads, head_size, dtype, device, sdpa=None):
    gen = torch.Generator().manual_seed(2)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(starts[-1]), num_heads, head_size, generator=gen).to(dtype).to(device)
    out = torch.full_like(q, float("nan"))
    scale = head_size**-0.5
    qsl = starts.to(device)
    ops.paged_prefill_attention(q, kv.key_cache, kv.value_cache, kv.block_tables, qsl, kv.context_lens, scale, out)
    assert not out.isnan().any()
    want = reference.paged_prefill_attention(
        q, kv.key_cache, kv.value_cache, kv.block_tables, qsl, kv.context_lens, scale
    )
    torch.testing.assert_close(out, want, **_tol(dtype))
    if sdpa is not None:
        for s in range(len(q_lens)):
            rows = slice(int(starts[s]), int(starts[s + 1]))
            expect = sdpa(q[rows], kv.keys[s], kv.values[s])
            torch.testing.assert_close(out[rows].float().cpu(), expect, **_tol(dtype))


@pytest.mark.parametrize("head_size,block_size,group,dtype", CASES)
def test_triton_prefill_matches_reference_and_sdpa(
    monkeypatch, paged_kv, sdpa, device, head_size, block_size, group, dtype
):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    b = block_size
    # (context, new tokens): one-token prompt, one full block, prefill over several query tiles,
    # a chunk starting mid-block after cached context, a single new token after a block boundary
    seqs = [(1, 1), (b, b), (2 * b + 3, 2 * b + 3), (3 * b, b // 2 + 3), (b + 1, 1)]
    kv = paged_kv([c for c, _ in seqs], b, 2, head_size, dtype, device=device, seed=head_size * block_size)
    _check_prefill(kv, [n for _, n in seqs], 2 * group, head_size, dtype, device, sdpa)


@pytest.mark.gpu(1)
@pytest.mark.parametrize("head_size,block_size,group,dtype", CASES)
def test_triton_prefill_compiled_cuda(paged_kv, head_size, block_size, group, dtype):
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(1, 700, (12,), generator=gen).tolist()
    q_lens = [max(1, c // k) for c, k in zip(ctx, [1, 2, 3] * 4)]
    kv = paged_kv(ctx, block_size, 4, head_size, dtype, device="cuda", seed=5)
    _check_prefill(kv, q_lens, 4 * group, head_size, dtype, "cuda")
