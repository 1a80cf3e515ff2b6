"""PowerSGD: send a rank-r approximation P Q^T of each gradient matrix M instead of M (Vogels et al., 2019).

torch's torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py, same state and hook. Per bucket, after
``start_powerSGD_iter`` plain iterations (so DDP has rebuilt its buckets first):

1. error feedback: add back what the last compression lost (``error_dict``);
2. matrices worth compressing ((n + m) r * min_compression_rate < n m) get P = M Q with Q from the last
   iteration (warm start; random at first) orthogonalised; the rest travel uncompressed;
3. all-reduce the uncompressed tensors, then P (orthogonalised after), then Q = M^T P, then M ~ P Q^T / world:
   the three all-reduces chained with ``then`` from one another's callbacks, as torch's hook does.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist._compat.ddp_comm_hooks import default_hooks

__all__ = ["PowerSGDState", "powerSGD_hook"]
log = logging.getLogger(__name__)


class PowerSGDState:
    """The hook's memory across iterations: the error left by compression and P, Q per bucket (torch's names)."""

    def __init__(self, process_group, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1_000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0,
                 compression_stats_logging_frequency: int = 10_000, batch_tensors_with_same_shape: bool = False):
        if isinstance(matrix_approximation_rank, bool) or not isinstance(matrix_approximation_rank, int) \
                or matrix_approximation_rank < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank must be a positive int, got "
                             f"{matrix_approximation_rank!r}")
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError("Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is enabled, "
                             "because PowerSGD can only be applied after the first two iterations in DDP.")
        self.process_group = process_group
        self.matrix_approximation_rank, self.start_powerSGD_iter = matrix_approximation_rank, start_powerSGD_iter
        self.min_compression_rate, self.orthogonalization_epsilon = min_compression_rate, orthogonalization_epsilon
        self.use_error_feedback, self.warm_start = use_error_feedback, warm_start
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.rng = torch.Generator().manual_seed(random_seed)  # the same draws on every rank
        self.error_dict: dict[int, torch.Tensor] = {}
        self.p_memory_dict: dict[int, torch.Tensor] = {}
        self.q_memory_dict: dict[int, torch.Tensor] = {}
        self.iter = 0
        self.total_numel_before_compression = self.total_numel_after_compression = 0
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.next_stats_report = 0

    def maybe_increase_iter(self, bucket) -> None:
        if bucket.is_last():
            self.iter += 1
            if self.iter == self.start_powerSGD_iter:
                log.info("PowerSGD: compressing from iteration %s on", self.iter)

    def compression_stats(self) -> tuple[float, int, int]:
        after = self.total_numel_after_compression
        return (self.total_numel_before_compression / after if after else 0,
                self.total_numel_before_compression, after)


def _orthogonalize(matrices: torch.Tensor, epsilon: float = 0) -> None:
    """Orthonormal columns in place, for a batch (b, n, r): Gram-Schmidt for small r or half precision (what
    torch's does), QR otherwise."""
    b, _, r = matrices.shape
    if r > 2 and matrices.dtype not in (torch.float16, torch.bfloat16):
        q, _ = torch.linalg.qr(matrices)
        matrices.copy_(q)
        return
    for i in range(r):
        col = matrices[:, :, i:i + 1]
        col /= torch.linalg.vector_norm(col, dim=1, keepdim=True) + epsilon
        if i + 1 < r:
            rest = matrices[:, :, i + 1:]
            rest -= (col * rest).sum(dim=1, keepdim=True) * col


def powerSGD_hook(state: PowerSGDState, bucket) -> torch.futures.Future:  # noqa: N802 - torch's name
    group = state.process_group if state.process_group is not None else c10d.group.WORLD
    world, buffer = group.size(), bucket.buffer()
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return default_hooks._allreduce_fut(group, buffer)
    index = bucket.index()
    if state.use_error_feedback:
        error = state.error_dict.setdefault(index, torch.zeros_like(buffer))
        buffer.add_(error)
        before = buffer.clone()
    rank = state.matrix_approximation_rank
    compressed, uncompressed = [], []
    for grad in bucket.gradients():
        matrix = grad.view(grad.shape[0] if grad.dim() else 1, -1)
        n, m = matrix.shape
        r = min(n, m, rank)
        worth = (n + m) * r * state.min_compression_rate < n * m
        state.total_numel_before_compression += n * m
        state.total_numel_after_compression += (n + m) * r if worth else n * m
        (compressed if worth else uncompressed).append(matrix if worth else grad)
    flat = torch.cat([t.reshape(-1) for t in uncompressed]) if uncompressed else buffer.new_empty(0)

    by_shape = defaultdict(list)  # matrices of one shape go as one batch if asked
    for matrix in compressed:
        by_shape[matrix.shape].append(matrix)
    groups = list(by_shape.values())
    if state.batch_tensors_with_same_shape:
        batches = [torch.stack(ms) if len(ms) > 1 else ms[0].unsqueeze(0) for ms in groups]
        stacked = [(ms, batch) for ms, batch in zip(groups, batches) if len(ms) > 1]  # copies: written back at the end
    else:
        batches, stacked = [m.unsqueeze(0) for ms in groups for m in ms], []  # views of the bucket
    sizes = [(b, n, m, min(n, m, rank)) for b, n, m in (t.shape for t in batches)]
    fresh = not state.warm_start or index not in state.p_memory_dict
    if fresh:
        state.p_memory_dict[index] = buffer.new_empty(sum(b * n * r for b, n, _, r in sizes))
        state.q_memory_dict[index] = buffer.new_empty(sum(b * m * r for b, _, m, r in sizes))
    ps = _views(state.p_memory_dict[index], [(b, n, r) for b, n, _, r in sizes])
    qs = _views(state.q_memory_dict[index], [(b, m, r) for b, _, m, r in sizes])
    for q in qs:
        if fresh:
            q.copy_(torch.randn(q.shape, generator=state.rng, dtype=q.dtype))
        _orthogonalize(q, state.orthogonalization_epsilon)
    for matrix, q, p in zip(batches, qs, ps):
        torch.bmm(matrix, q, out=p)

    def all_reduce_ps(fut):
        reduced = fut.value()[0].div_(world)
        offset = 0
        for t in uncompressed:
            t.copy_(reduced[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        return c10d.all_reduce(state.p_memory_dict[index], group=group, async_op=True).get_future().wait()[0]

    def all_reduce_qs(fut):
        for p in ps:
            _orthogonalize(p, state.orthogonalization_epsilon)
        for matrix, p, q in zip(batches, ps, qs):
            torch.bmm(matrix.transpose(1, 2), p, out=q)
        return c10d.all_reduce(state.q_memory_dict[index], group=group, async_op=True).get_future().wait()[0]

    def decompress(fut):
        state.q_memory_dict[index].div_(world)
        for p, q, matrix in zip(ps, qs, batches):
            torch.bmm(p, q.transpose(1, 2), out=matrix)
        for ms, batch in stacked:
            for original, approx in zip(ms, batch):
                original.copy_(approx)
        if state.use_error_feedback:
            state.error_dict[index] = before - buffer  # what this compression lost, added back next time
        if not state.warm_start:
            state.p_memory_dict.clear()
            state.q_memory_dict.clear()
        state.maybe_increase_iter(bucket)
        return buffer

    return c10d.all_reduce(flat, group=group, async_op=True).get_future().then(all_reduce_ps).then(
        all_reduce_qs).then(decompress)


def _views(memory: torch.Tensor, shapes) -> list[torch.Tensor]:
    out, offset = [], 0
    for b, n, r in shapes:
        out.append(memory[offset:offset + b * n * r].view(b, n, r))
        offset += b * n * r
    return out

