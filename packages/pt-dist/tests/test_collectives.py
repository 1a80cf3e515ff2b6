"""Every collective x backend x world size 1-4 x dtypes x odd sizes, against results computed locally.

One ``run_ranks`` call per (backend, world size) loops over all cases inside the ranks (spawned ranks
are expensive); each rank returns the list of mismatches and how many checks it ran, so a test that
silently checked nothing fails too. The torch-backed adapter (gloo) is held to the same expectations.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pt_dist
import pytest
import torch
from pt_dist import ReduceOp

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).parent))
import ptdist_testutil as util  # noqa: E402
from ptdist_testutil import close, reference  # noqa: E402

NATIVE_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.bool, torch.complex64]
GLOO_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
SIZES = [0, 1, 7, 1031, "nc"]  # "nc": a non-contiguous (6, 5) transpose


def make(rank: int, n: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    v = (torch.arange(n) * (rank + 2) + salt * 7 + rank) % 5 + 1
    if dtype == torch.bool:
        return v % 2 == 0
    if dtype.is_complex:
        return (v * 0.5 + 1j * (v % 3)).to(dtype)
    if dtype.is_floating_point:
        return (v * 0.5).to(dtype)
    return (v - 2).to(dtype)


def shaped(rank, size, dtype, salt, scale=1):
    """A tensor of the case's size; "nc" gives a non-contiguous transposed view."""
    if size == "nc":
        return make(rank, 30 * scale, dtype, salt).view(5 * scale, 6).t()
    return make(rank, size * scale, dtype, salt)


def ops_for(dtype):
    if dtype.is_complex:
        return [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT]
    if dtype.is_floating_point:
        return [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    return [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]


def _matrix(rank, world_size, backend, dtypes):
    from pt_dist._infra import cma, single_copy
    from pt_dist.backends import tcp
    from pt_dist.backends.shm import process_group_shm as shm

    # tiny chunks/slots so 1031-element cases cross many pipeline chunks and shm rounds, while sizes up to
    # 30 take shm's one-barrier small all-reduce; 1031 elements of 4 or 8 bytes take shm's single-copy
    # (cross-memory) collectives with 512-byte reduction chunks, of 1 or 2 bytes its staged two-copy ones
    # (all-gather and reduce-scatter switch on the whole buffer, world_size x 1031 elements)
    saved = tcp.CHUNK_BYTES, shm.SLOT_BYTES, shm.SMALL_BYTES, cma.MIN_BYTES, single_copy.CHUNK_BYTES
    tcp.CHUNK_BYTES, shm.SLOT_BYTES, shm.SMALL_BYTES = 512, 4096, 1024
    cma.MIN_BYTES, single_copy.CHUNK_BYTES = 4096, 512
    try:
        util.join(rank, world_size, backend)
        check = util.Checks(f"{backend} ws={world_size} rank={rank}")

        ws, me = world_size, rank
        for dtype in dtypes:
            for salt, size in enumerate(SIZES):
                tag = f"{dtype} size={size}"
                everyone = [shaped(r, size, dtype, salt) for r in range(ws)]
                for op in ops_for(dtype):
                    t = shaped(me, size, dtype, salt)
                    pt_dist.all_reduce(t, op=op)
                    check(f"all_reduce {op.name} {tag}", t, reference(everyone, op))
                src = salt % ws
                t = shaped(me, size, dtype, salt)
                pt_dist.broadcast(t, src=src)
                check(f"broadcast src={src} {tag}", t, everyone[src])
                dst = (salt + 1) % ws
                t = shaped(me, size, dtype, salt)
                pt_dist.reduce(t, dst=dst, op=ReduceOp.SUM)
                check(f"reduce dst={dst} {tag}", t, reference(everyone, ReduceOp.SUM) if me == dst else everyone[me])
                x = shaped(me, size, dtype, salt)
                out = torch.zeros(ws * x.numel(), dtype=dtype)
                pt_dist.all_gather_into_tensor(out, x)
                check(f"all_gather_into_tensor {tag}", out, torch.cat([e.reshape(-1) for e in everyone]))
                outs = [torch.zeros_like(x) for _ in range(ws)]
                pt_dist.all_gather(outs, x)
                for r in range(ws):
                    check(f"all_gather[{r}] {tag}", outs[r], everyone[r])
                ins = [shaped(r, size, dtype, salt, scale=ws) for r in range(ws)]
                out = torch.zeros_like(x)
                pt_dist.reduce_scatter_tensor(out, ins[me], op=ReduceOp.SUM)
                want = reference([i.reshape(ws, -1)[me] for i in ins], ReduceOp.SUM).view(x.shape)
                check(f"reduce_scatter_tensor {tag}", out, want)
                # the in-place forms (NCCL's): my input is my own block of the output / my output of the input
                m = x.numel()
                flat = torch.zeros(ws * m, dtype=dtype)
                flat[me * m:(me + 1) * m] = x.reshape(-1)
                pt_dist.all_gather_into_tensor(flat, flat[me * m:(me + 1) * m])
                check(f"all_gather_into_tensor in place {tag}", flat, torch.cat([e.reshape(-1) for e in everyone]))
                wide = ins[me].reshape(-1).clone()
                pt_dist.reduce_scatter_tensor(wide[me * m:(me + 1) * m], wide, op=ReduceOp.SUM)
                check(f"reduce_scatter_tensor in place {tag}", wide[me * m:(me + 1) * m].view(x.shape), want)
            # all_to_all_single with unequal (and zero) splits, into a non-contiguous output (a strided input is
            # refused, as torch's backends refuse it: test_c10d_upstream.py)
            splits = [[(r + 2 * j) % 3 for j in range(ws)] for r in range(ws)]
            blocks = [make(r, 3 * sum(splits[r]), dtype, 5).view(3, -1).t().contiguous() for r in range(ws)]
            out = torch.zeros(3, sum(splits[j][me] for j in range(ws)), dtype=dtype).t()
            pt_dist.all_to_all_single(out, blocks[me], [splits[j][me] for j in range(ws)], splits[me])
            want = torch.cat([torch.split(blocks[j], splits[j])[me] for j in range(ws)])
            check(f"all_to_all_single {dtype} splits={splits}", out, want)
            flat = torch.zeros(out.numel(), dtype=dtype)  # rows of 1 element out, of 3 in: torch counts elements
            pt_dist.all_to_all_single(flat, blocks[me], [3 * splits[j][me] for j in range(ws)], splits[me])
            check(f"all_to_all_single into 1-D {dtype} splits={splits}", flat, want.reshape(-1))
            if ws > 1:  # a ring of isend/irecv; the receive buffer is non-contiguous
                got = torch.zeros(5, 6, dtype=dtype).t()
                works = [pt_dist.isend(shaped(me, "nc", dtype, 9), (me + 1) % ws),
                         pt_dist.irecv(got, (me - 1) % ws)]
                for w in works:
                    w.wait()
                check(f"isend/irecv {dtype}", got, shaped((me - 1) % ws, "nc", dtype, 9))
        # async collectives queue in order and overlap with the caller
        ts = [torch.full((1000,), float(me + k)) for k in range(3)]
        works = [pt_dist.all_reduce(t, async_op=True) for t in ts]
        futs = [w.get_future().then(lambda f: f.value()[0].sum().item()) for w in works]
        for k, (w, f) in enumerate(zip(works, futs)):
            w.wait()
            assert w.is_completed() and w.is_success()
            check(f"async all_reduce {k}", ts[k], torch.full((1000,), float(sum(range(ws)) + ws * k)))
            check.count += f.wait() == 1000 * float(sum(range(ws)) + ws * k)
        pt_dist.barrier()
        util.leave()
        return check.fails, check.count
    finally:
        tcp.CHUNK_BYTES, shm.SLOT_BYTES, shm.SMALL_BYTES, cma.MIN_BYTES, single_copy.CHUNK_BYTES = saved
        if pt_dist.is_initialized():
            pt_dist.destroy_process_group()


def _expected_checks(ws, dtypes):
    per_size = sum(len(ops_for(d)) for d in dtypes) + len(dtypes) * (6 + ws)
    return per_size * len(SIZES) + len(dtypes) * (2 + (ws > 1)) + 6


@pytest.mark.parametrize("backend", ["tcp", "shm"])
def test_native_collectives_match_local_reference(backend):
    for ws in (4, 3, 2, 1):  # largest first: the harness pool of 4 ranks then serves every size
        results = run_ranks(_matrix, ws, backend, NATIVE_DTYPES, backend=None, timeout=240)
        for fails, checks in results:
            assert fails == []
            assert checks == _expected_checks(ws, NATIVE_DTYPES)


def test_gloo_adapter_meets_the_same_expectations():
    for ws in (3, 2):
        for fails, checks in run_ranks(_matrix, ws, "gloo", GLOO_DTYPES, backend=None, timeout=240):
            assert fails == []
            assert checks == _expected_checks(ws, GLOO_DTYPES)


def test_reference_is_not_vacuous():
    """The checker itself must catch a wrong answer."""
    xs = [make(r, 7, torch.float32, 1) for r in range(3)]
    assert close(reference(xs, ReduceOp.SUM), sum(xs))
    assert not close(reference(xs, ReduceOp.SUM), reference(xs, ReduceOp.MAX))
    assert not close(torch.ones(3), torch.ones(4))


def _parameters(rank, world_size):
    """c10d works below autograd: collectives and p2p on nn.Parameters (leaves that require grad) just run."""
    out = {}
    for backend in ("tcp", "shm", "gloo"):
        util.join(rank, world_size, backend, key=f"param-{backend}")
        for n in (10, 1 << 17):  # shm: the one-barrier path and the single-copy one
            got = []
            p = torch.nn.Parameter(torch.full((n,), rank + 1.0))
            pt_dist.all_reduce(p)
            got.append(float(p[0]))
            p = torch.nn.Parameter(torch.full((n,), rank + 1.0))
            pt_dist.broadcast(p, src=1)
            got.append(float(p[0]))
            gathered = torch.nn.Parameter(torch.zeros(world_size * n))
            pt_dist.all_gather_into_tensor(gathered, torch.nn.Parameter(torch.full((n,), rank + 1.0)))
            got.append(gathered.view(world_size, n)[:, 0].tolist())
            p = torch.nn.Parameter(torch.full((n,), rank + 1.0))
            pt_dist.reduce_scatter_tensor(torch.nn.Parameter(torch.zeros(n // world_size)), p)
            if rank == 0:
                pt_dist.send(p, dst=1)
            else:
                pt_dist.recv(p, src=0)
            got.append(float(p[0]))
            out[(backend, n)] = got
        util.leave()
    return out


def test_collectives_on_parameters_that_require_grad():
    want = {0: [3.0, 2.0, [1.0, 2.0], 1.0], 1: [3.0, 2.0, [1.0, 2.0], 1.0]}
    for rank, res in enumerate(run_ranks(_parameters, 2, backend=None, timeout=120)):
        for key, got in res.items():
            assert got == want[rank], (rank, key, got)


def _inference_tensors(rank, world_size):
    """Tensors made under torch.inference_mode(), used outside it (a model's outputs gathered for metrics): c10d
    writes them below autograd; ours once raised "Inplace update to inference tensor" half-way through."""
    out = {}
    for backend in ("tcp", "shm", "gloo"):
        util.join(rank, world_size, backend, key=f"inference-{backend}")
        got = []
        for n in (10, 1 << 17):  # shm: the one-barrier path and the single-copy one
            with torch.inference_mode():
                t = torch.full((n,), rank + 1.0)
                nc = torch.full((3, 4), rank + 1.0).t()  # non-contiguous: staged and copied back
            pt_dist.all_reduce(t, op=ReduceOp.AVG)  # gloo: the adapter divides afterwards
            pt_dist.broadcast(nc, src=1)
            got += [t[0].item(), nc[0, 0].item()]
        with torch.inference_mode():
            box = torch.zeros(4, 3).t()
        if rank == 0:
            pt_dist.send(torch.full((3, 4), 5.0), dst=1)
        else:
            pt_dist.recv(box, src=0)  # received into a copy, then copied back into the inference tensor
        got.append(box[0, 0].item())
        with torch.inference_mode():  # outputs of the gathers (the gloo adapter handed them to torch's, which refuse)
            whole, part = torch.zeros(2 * world_size), torch.zeros(2)
            pairs = [torch.zeros(2, dtype=torch.complex64) for _ in range(world_size)]
        pt_dist.all_gather_into_tensor(whole, torch.full((2,), float(rank)))
        pt_dist.reduce_scatter_tensor(part, torch.ones(2 * world_size))
        pt_dist.all_gather(pairs, torch.full((2,), complex(rank, 1)))
        got.append((whole.tolist(), part.tolist(), [p.tolist() for p in pairs]))
        out[backend] = got
        util.leave()
    return out


def test_collectives_on_inference_tensors():
    for rank, res in enumerate(run_ranks(_inference_tensors, 2, backend=None, timeout=120)):
        for backend, got in res.items():
            gathered = ([0.0, 0.0, 1.0, 1.0], [2.0, 2.0], [[0j + 1j] * 2, [1 + 1j] * 2])
            assert got == [1.5, 2.0, 1.5, 2.0, 5.0 if rank else 0.0, gathered], (rank, backend, got)
