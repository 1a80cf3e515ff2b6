"""The pure-torch ops (CPU run-time path, and oracle of the Triton kernels) vs scaled_dot_product_attention."""

from __future__ import annotations

import pytest
import torch
from paged_serve import ops
from paged_serve.ops import reference


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_matches_sdpa(paged_kv, sdpa, group, dtype):
    lens = [1, 16, 17, 5, 48]
    kv = paged_kv(lens, 16, 2, 64, dtype)
    q = torch.randn(len(lens), 2 * group, 64).to(dtype)
    out = torch.full_like(q, float("nan"))
    reference.paged_attention(q, kv.key_cache, kv.value_cache, kv.block_tables, kv.context_lens, 64**-0.5, out)
    assert not out.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for s in range(len(lens)):
        want = sdpa(q[s : s + 1], kv.keys[s], kv.values[s])[0]
        torch.testing.assert_close(out[s].float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("group", [1, 2])
def test_paged_prefill_matches_sdpa(paged_kv, sdpa, group):
    lens = [9, 32, 1, 20]
    q_lens = [9, 7, 1, 1]  # full prefill, chunked prefill, one-token prompt, decode-like chunk
    kv = paged_kv(lens, 8, 2, 80, torch.float32)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(starts[-1]), 2 * group, 80)
    out = reference.paged_prefill_attention(
        q, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.context_lens, 80**-0.5
    )
    for s in range(len(lens)):
        want = sdpa(q[starts[s] : starts[s + 1]], kv.keys[s], kv.values[s])
        torch.testing.assert_close(out[starts[s] : starts[s + 1]], want, atol=1e-5, rtol=1e-5)


def test_prefill_equals_decode_for_last_token(paged_kv):
    """A sanity link between the two ops: prefill's last row is the decode of the last token."""
    kv = paged_kv([13], 8, 1, 64, torch.float32)
    q = torch.randn(13, 2, 64)
    starts = torch.tensor([0, 13])
    caches = (kv.key_cache, kv.value_cache, kv.block_tables)
    pre = reference.paged_prefill_attention(q, *caches, starts, kv.context_lens, 1.0)
    dec = reference.paged_attention(q[-1:], *caches, kv.context_lens, 1.0)
    torch.testing.assert_close(pre[-1], dec[0])
    assert not torch.allclose(pre[0], dec[0])  # the first row sees one key only: the mask is really applied


def test_reshape_and_cache_writes_slots_and_skips_padding():
    key_cache = torch.zeros(4, 8, 2, 16)
    value_cache = torch.zeros(4, 8, 2, 16)
    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    reference.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([9, -1, 31]))
    assert torch.equal(key_cache[1, 1], key[0]) and torch.equal(value_cache[3, 7], value[2])
    assert int((key_cache != 0).any(-1).any(-1).sum()) == 2  # exactly two slots written, the padding one skipped


def test_copy_blocks_and_swap_blocks():
    caches = [torch.randn(6, 8, 2, 16) for _ in range(4)]
    before = [c.clone() for c in caches]
    reference.copy_blocks(caches[:2], caches[2:], torch.tensor([[0, 3], [5, 1]]))
    for c, b in zip(caches, before):
        assert torch.equal(c[3], b[0]) and torch.equal(c[1], b[5]) and torch.equal(c[0], b[0])
        assert torch.equal(c[2], b[2]) and torch.equal(c[4], b[4])
    src, dst = torch.randn(6, 8, 2, 16), torch.zeros(3, 8, 2, 16)
    reference.swap_blocks(src, dst, torch.tensor([[4, 0], [1, 2]]))
    assert torch.equal(dst[0], src[4]) and torch.equal(dst[2], src[1]) and not dst[1].any()


def test_dispatcher_backend_choice(monkeypatch):
    monkeypatch.delenv("PAGED_SERVE_ATTENTION", raising=False)
    assert ops.get_backend("cpu") == "torch"
    assert ops.get_backend("cuda") == "triton"
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "torch")
    assert ops.get_backend("cuda") == "torch"
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "cuda-graphs")
    with pytest.raises(ValueError, match="cuda-graphs"):
        ops.get_backend("cpu")


def test_dispatcher_validates_shapes():
    cache = torch.zeros(4, 16, 2, 64)
    tables, lens = torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="not a multiple"):
        ops.paged_attention(torch.zeros(2, 3, 64), cache, cache, tables, lens)
    with pytest.raises(ValueError, match="head_size 80"):
        ops.paged_attention(torch.zeros(2, 2, 80), cache, cache, tables, lens)
    with pytest.raises(ValueError, match="block_size 12"):
        ops.paged_attention(torch.zeros(2, 2, 64), torch.zeros(4, 12, 2, 64), torch.zeros(4, 12, 2, 64), tables, lens)
    with pytest.raises(ValueError, match="slot_mapping"):
        ops.reshape_and_cache(torch.zeros(3, 2, 64), torch.zeros(3, 2, 64), cache, cache, torch.zeros(2))
    with pytest.raises(ValueError, match="dtype"):
        ops.paged_attention(torch.zeros(2, 2, 64, dtype=torch.bfloat16), cache, cache, tables, lens)
    with pytest.raises(ValueError, match="context_lens must be int32 or int64"):
        ops.paged_attention(torch.zeros(2, 2, 64), cache, cache, tables, lens.float())


def test_dispatcher_refuses_compiled_triton_on_cpu(monkeypatch):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cache = torch.zeros(4, 16, 2, 64)
    tables, lens = torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        ops.paged_attention(torch.zeros(2, 2, 64), cache, cache, tables, lens)
