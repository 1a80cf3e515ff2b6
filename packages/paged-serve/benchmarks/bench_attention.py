"""Attention kernel time: the paged ops vs ``scaled_dot_product_attention`` on already-gathered contiguous K/V.

CPU (always): the pure-torch paged path (``PAGED_SERVE_ATTENTION=torch``, what runs on CPU) for decode and
prefill vs torch SDPA over the same K/V laid out contiguously (the peer a non-paged cache would call). On CUDA
(when present) the Triton decode kernel's achieved bandwidth (K/V bytes it must read / time) vs the device's
copy bandwidth measured in the same run (a device-to-device ``copy_`` of 1 GiB: read + write bytes / time).

    uv run python packages/paged-serve/benchmarks/bench_attention.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from paged_serve import ops


def median_time(fn, repeats: int, sync=lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(context_lens, block_size, num_kv_heads, head_size, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in context_lens]
    total = sum(blocks)
    key_cache = torch.randn(total, block_size, num_kv_heads, head_size, generator=gen).to(device, dtype)
    value_cache = torch.randn(total, block_size, num_kv_heads, head_size, generator=gen).to(device, dtype)
    perm = torch.randperm(total, generator=gen)
    tables = torch.zeros(len(context_lens), max(blocks), dtype=torch.int32)
    cursor = 0
    for s, nb in enumerate(blocks):
        tables[s, :nb] = perm[cursor : cursor + nb].to(torch.int32)
        cursor += nb
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return key_cache, value_cache, tables.to(device), lens.to(device)


def contiguous_padded(cache, tables, lens, group):
    """[num_seqs, num_heads, max_len, head_size] with GQA heads expanded, plus the padding mask."""
    max_len = int(lens.max())
    kv = torch.stack([ops.gather_kv(cache, tables[s], max_len) for s in range(len(lens))])
    mask = torch.arange(max_len, device=cache.device)[None, :] < lens[:, None].long()
    return kv.repeat_interleave(group, dim=2).transpose(1, 2).contiguous(), mask[:, None, None, :]


def cpu_rows(args):
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, head_size, bs = 32, 8, 128, 16
    group = heads // kv_heads
    os.environ["PAGED_SERVE_ATTENTION"] = "torch"
    lens = torch.randint(64, args.max_context, (args.batch,), generator=gen).tolist()
    kc, vc, tables, ctx = build(lens, bs, kv_heads, head_size, torch.float32, "cpu")
    q = torch.randn(len(lens), heads, head_size, generator=gen)
    k, mask = contiguous_padded(kc, tables, ctx, group)
    v, _ = contiguous_padded(vc, tables, ctx, group)
    t_paged = median_time(lambda: ops.paged_attention(q, kc, vc, tables, ctx), args.repeats)
    t_sdpa = median_time(lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask), args.repeats)
    rows = [(f"decode, {len(lens)} seqs, ctx 64-{args.max_context}", t_paged, t_sdpa)]

    plens = torch.randint(32, args.max_prompt, (args.prefill_batch,), generator=gen).tolist()
    kc, vc, tables, ctx = build(plens, bs, kv_heads, head_size, torch.float32, "cpu", seed=1)
    starts = torch.tensor([0, *torch.tensor(plens).cumsum(0).tolist()], dtype=torch.int32)
    qp = torch.randn(int(starts[-1]), heads, head_size, generator=gen)
    kvs = [
        (
            ops.gather_kv(kc, tables[s], n).repeat_interleave(group, 1).transpose(0, 1)[None],
            ops.gather_kv(vc, tables[s], n).repeat_interleave(group, 1).transpose(0, 1)[None],
        )
        for s, n in enumerate(plens)
    ]

    def sdpa_prefill():
        for s, (ks, vs) in enumerate(kvs):
            qs = qp[starts[s] : starts[s + 1]].transpose(0, 1)[None]
            F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    t_paged = median_time(lambda: ops.paged_prefill_attention(qp, kc, vc, tables, starts, ctx), args.repeats)
    t_sdpa = median_time(sdpa_prefill, args.repeats)
    rows.append((f"prefill, {len(plens)} prompts, 32-{args.max_prompt} tokens", t_paged, t_sdpa))
    return rows


def gpu_rows(args):
    sync = torch.cuda.synchronize
    heads, kv_heads, head_size, bs = 32, 8, 128, 16
    os.environ["PAGED_SERVE_ATTENTION"] = "triton"
    src = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    t_copy = median_time(lambda: dst.copy_(src), args.repeats, sync)
    copy_bw = 2 * src.numel() * src.element_size() / t_copy
    print(f"device copy bandwidth: {copy_bw / 1e9:.0f} GB/s")
    print("| decode batch | context | Triton decode time (ms) | achieved GB/s | vs copy bandwidth |")
    print("|---|---|---|---|---|")
    for batch, context in ((32, 1024), (64, 2048), (128, 4096)):
        kc, vc, tables, ctx = build([context] * batch, bs, kv_heads, head_size, torch.bfloat16, "cuda")
        q = torch.randn(batch, heads, head_size, device="cuda", dtype=torch.bfloat16)
        t = median_time(lambda a=(q, kc, vc, tables, ctx): ops.paged_attention(*a), args.repeats, sync)
        kv_bytes = 2 * batch * context * kv_heads * head_size * 2
        bw = kv_bytes / t
        print(f"| {batch} | {context} | {t * 1e3:.3f} | {bw / 1e9:.0f} | {bw / copy_bw:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-context", type=int, default=1024)
    parser.add_argument("--prefill-batch", type=int, default=4)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("CPU, fp32, 32 query heads / 8 KV heads, head size 128, block size 16 (median of", args.repeats, "runs)")
    print("| op | paged torch path (ms) | SDPA on gathered K/V (ms) | paged / SDPA |")
    print("|---|---|---|---|")
    for name, t_paged, t_sdpa in cpu_rows(args):
        print(f"| {name} | {t_paged * 1e3:.2f} | {t_sdpa * 1e3:.2f} | {t_paged / t_sdpa:.2f}x |")
    if torch.cuda.is_available():
        gpu_rows(args)
    else:
        print("no CUDA device: Triton decode bandwidth not measured")


if __name__ == "__main__":
    main()
