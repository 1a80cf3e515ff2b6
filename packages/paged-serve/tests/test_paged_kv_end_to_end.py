"""Block manager + ops together, as the engine will drive them: prefill, fork with copy-on-write, decode, swap
out/in, prefix-cache reuse with chunked prefill. Every attention output is checked against SDPA over K/V computed
directly from the sequence's tokens, so a wrong slot, a missed copy or a bad shared block shows up as a mismatch.
"""

from __future__ import annotations

import pytest
import torch
from paged_serve import ops
from paged_serve.core import BlockSpaceManager, Sequence, SequenceGroup, SequenceStatus

BS, KV_HEADS, HEADS, D, VOCAB, MAX_POS = 8, 2, 4, 64, 50, 64


class TinyKV:
    """Deterministic K/V/Q per (token, position): a stand-in for a model's projections."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.tok = torch.randn(3, VOCAB, KV_HEADS, D, generator=gen)
        self.pos = torch.randn(3, MAX_POS, KV_HEADS, D, generator=gen)

    def kvq(self, tokens, positions):
        t, p = torch.tensor(tokens), torch.tensor(positions)
        k, v, q = (self.tok[i][t] + self.pos[i][p] for i in range(3))
        return k, v, q.repeat_interleave(HEADS // KV_HEADS, dim=1)


def _slots(manager, seq, positions):
    table = manager.get_block_table(seq)
    return torch.tensor([table[p // BS] * BS + p % BS for p in positions])


def _expected(model, seq, q_positions, sdpa):
    tokens = seq.get_token_ids()
    k, v, _ = model.kvq(tokens, list(range(len(tokens))))
    _, _, q = model.kvq([tokens[p] for p in q_positions], q_positions)
    out = sdpa(q, k[: q_positions[-1] + 1], v[: q_positions[-1] + 1])
    return out


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_engine_like_loop(monkeypatch, sdpa, device, backend):
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", backend)
    model = TinyKV()
    manager = BlockSpaceManager(BS, 16, 8, watermark=0.0, enable_caching=True)
    gpu = [torch.full((16, BS, KV_HEADS, D), float("nan"), device=device) for _ in range(2)]
    cpu = [torch.full((8, BS, KV_HEADS, D), float("nan")) for _ in range(2)]

    def write(seq, positions):
        tokens = seq.get_token_ids()
        k, v, _ = model.kvq([tokens[p] for p in positions], positions)
        ops.reshape_and_cache(k.to(device), v.to(device), gpu[0], gpu[1], _slots(manager, seq, positions).to(device))

    def prefill(seqs, computed):
        """Chunked prefill of each sequence's tokens after its first ``computed`` ones; returns attention outputs."""
        qs, starts, tables, lens = [], [0], [], []
        for seq, done in zip(seqs, computed):
            positions = list(range(done, seq.get_len()))
            write(seq, positions)
            qs.append(model.kvq([seq.get_token_ids()[p] for p in positions], positions)[2])
            starts.append(starts[-1] + len(positions))
            tables.append(manager.get_block_table(seq))
            lens.append(seq.get_len())
        width = max(map(len, tables))
        bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        q, bt = torch.cat(qs).to(device), bt.to(device)
        qsl = torch.tensor(starts, dtype=torch.int32, device=device)
        ctx = torch.tensor(lens, dtype=torch.int32, device=device)
        out = ops.paged_prefill_attention(q, gpu[0], gpu[1], bt, qsl, ctx, out=torch.full_like(q, float("nan")))
        return out.cpu()

    def decode(seqs):
        width = max(len(manager.get_block_table(s)) for s in seqs)
        bt = torch.tensor([manager.get_block_table(s) + [0] * (width - len(manager.get_block_table(s))) for s in seqs])
        lens = torch.tensor([s.get_len() for s in seqs], dtype=torch.int32, device=device)
        q = torch.cat([model.kvq([s.get_token_ids()[-1]], [s.get_len() - 1])[2] for s in seqs]).to(device)
        out = ops.paged_attention(q, gpu[0], gpu[1], bt.to(device, torch.int32), lens).cpu()
        for i, s in enumerate(seqs):
            torch.testing.assert_close(out[i], _expected(model, s, [s.get_len() - 1], sdpa)[0], atol=1e-4, rtol=1e-4)

    # prefill a 13-token prompt
    parent = Sequence(1, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9], BS)
    group = SequenceGroup("a", [parent])
    manager.allocate(group)
    out = prefill([parent], [0])
    torch.testing.assert_close(out, _expected(model, parent, list(range(13)), sdpa), atol=1e-4, rtol=1e-4)
    parent.status = SequenceStatus.RUNNING
    manager.mark_blocks_as_computed(group)

    # fork (parallel sampling): the shared, partially filled last block is copied on the first divergent write
    child = parent.fork(2)
    manager.fork(parent, child)
    group.add(child)
    num_cows = 0
    for step in range(6):
        for seq, token in ((parent, 10 + step), (child, 20 + step)):
            seq.append_token_id(token)
            cows = manager.append_slots(seq)
            num_cows += len(cows)
            ops.copy_blocks([gpu[0]], [gpu[1]], torch.tensor(cows, dtype=torch.int64).reshape(-1, 2).to(device))
            write(seq, [seq.get_len() - 1])
        decode([parent, child])
        manager.mark_blocks_as_computed(group)  # after the forward pass: full blocks become cacheable
    assert num_cows == 1

    # swap the group out (GPU -> CPU), scribble over free GPU blocks, swap back in, keep decoding
    assert manager.can_swap_out(group)
    out_map = torch.tensor(manager.swap_out(group))
    # blocks back on the free list may be overwritten by anyone; cached ones kept for reuse (evictor) may not
    reusable = torch.tensor([b.block_number for b in manager.gpu_allocator.free_blocks])
    assert len(manager.gpu_allocator.evictor) == 3  # full blocks stay cached: the prompt one, one per sequence
    for cache, host in zip(gpu, cpu):
        ops.swap_blocks(cache, host, out_map)
        cache[reusable] = float("nan")
    for seq in group.get_seqs():
        seq.status = SequenceStatus.SWAPPED
    in_map = torch.tensor(manager.swap_in(group))
    for cache, host in zip(gpu, cpu):
        ops.swap_blocks(host, cache, in_map)
    for seq in group.get_seqs():
        seq.status = SequenceStatus.RUNNING
    for seq in (parent, child):
        seq.append_token_id(7)
        ops.copy_blocks([gpu[0]], [gpu[1]], torch.tensor(manager.append_slots(seq)).reshape(-1, 2))
        write(seq, [seq.get_len() - 1])
    decode([parent, child])
    manager.mark_blocks_as_computed(group)

    # a new request with the same prompt: the cached full block is reused, only the rest is prefilled
    other = Sequence(3, parent.prompt_token_ids + [42, 43, 44], BS)
    g2 = SequenceGroup("b", [other])
    manager.allocate(g2)
    computed = len(manager.get_common_computed_block_ids([other])) * BS
    assert computed == BS and manager.get_prefix_cache_hit_rate() > 0
    out = prefill([other], [computed])
    expect = _expected(model, other, list(range(computed, other.get_len())), sdpa)
    torch.testing.assert_close(out, expect, atol=1e-4, rtol=1e-4)

    for seq in (parent, child, other):
        manager.free(seq)
    assert manager.get_num_free_gpu_blocks() == 16 and manager.get_num_free_cpu_blocks() == 8


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_ops_accept_slices_of_a_fused_qkv(monkeypatch, device, backend):
    """A model writes q, k, v as views of one fused projection (non-contiguous rows); the ops must honour strides."""
    monkeypatch.setenv("PAGED_SERVE_ATTENTION", backend)
    tokens = 10
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * D, device=device)
    q = qkv[:, : HEADS * D].view(tokens, HEADS, D)
    k = qkv[:, HEADS * D : (HEADS + KV_HEADS) * D].view(tokens, KV_HEADS, D)
    v = qkv[:, (HEADS + KV_HEADS) * D :].view(tokens, KV_HEADS, D)
    assert not q.is_contiguous() and not k.is_contiguous()
    caches = [torch.zeros(4, BS, KV_HEADS, D, device=device) for _ in range(2)]
    slots = torch.tensor([3 * BS + i if i < BS else BS + i - BS for i in range(tokens)], device=device)
    ops.reshape_and_cache(k, v, caches[0], caches[1], slots)
    tables = torch.tensor([[3, 1]], dtype=torch.int32, device=device)
    lens = torch.tensor([tokens], dtype=torch.int32, device=device)
    qsl = torch.tensor([0, tokens], dtype=torch.int32, device=device)
    pre = ops.paged_prefill_attention(q, *caches, tables, qsl, lens)
    dec = ops.paged_attention(q[-1:], *caches, tables, lens)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(2, 1).transpose(0, 1),
        v.repeat_interleave(2, 1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    torch.testing.assert_close(pre, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dec[0], want[-1], atol=1e-4, rtol=1e-4)
