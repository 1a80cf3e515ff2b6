"""The Triton wrappers read strided index tensors (slot_mapping, block tables, lengths) as the torch path does.

A strided view (a column slice of a wider table, every other element of a larger buffer) used to be read as if
packed: silently wrong attention, or K/V written to the wrong slots.
"""

from __future__ import annotations

import torch
from paged_serve import ops
from paged_serve.ops import reference


def _strided(t: torch.Tensor, fill: int) -> torch.Tensor:
    """The same values as ``t`` in a view whose elements are two apart (garbage in between)."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), fill, dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


def _column_strided(table: torch.Tensor) -> torch.Tensor:
    """A block table with a column stride != 1 (a transposed buffer)."""
    return table.t().contiguous().t()


def test_reshape_and_cache_reads_a_strided_slot_mapping(monkeypatch, device):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    key, value = torch.randn(5, 2, 64, device=device), torch.randn(5, 2, 64, device=device)
    slots = _strided(torch.tensor([9, 2, 30, 17, 5], device=device), fill=0)
    assert slots.stride() == (2,)
    got = [torch.zeros(4, 8, 2, 64, device=device) for _ in range(2)]
    want = [torch.zeros(4, 8, 2, 64, device=device) for _ in range(2)]
    ops.reshape_and_cache(key, value, *got, slots)
    reference.reshape_and_cache(key, value, *want, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_decode_reads_strided_block_tables_and_lengths(monkeypatch, paged_kv, device):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    kv = paged_kv([5, 19, 33], 8, 2, 64, torch.float32, device=device, seed=4)
    tables, lens = _column_strided(kv.block_tables), _strided(kv.context_lens, fill=1)
    assert tables.stride(1) != 1 and lens.stride() == (2,)
    q = torch.randn(3, 4, 64, device=device)
    got = ops.paged_attention(q, kv.key_cache, kv.value_cache, tables, lens)
    want = reference.paged_attention(q, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, 64**-0.5)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_prefill_reads_strided_block_tables_starts_and_lengths(monkeypatch, paged_kv, device):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    kv = paged_kv([7, 20], 8, 2, 64, torch.float32, device=device, seed=5)
    starts = torch.tensor([0, 7, 12], dtype=torch.int32, device=device)  # 7 new tokens, then a 5-token chunk
    q = torch.randn(12, 2, 64, device=device)
    got = ops.paged_prefill_attention(
        q,
        kv.key_cache,
        kv.value_cache,
        _column_strided(kv.block_tables),
        _strided(starts, 0),
        _strided(kv.context_lens, 1),
    )
    want = reference.paged_prefill_attention(
        q, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, 64**-0.5
    )
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
