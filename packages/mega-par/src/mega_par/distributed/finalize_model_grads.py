"""After the last backward of a step: finish DP grad sync, all-reduce SP-replicated grads over TP
and tied-embedding grads over the embedding group (``distributed/finalize_model_grads.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps


def _unwrap(model):
    return getattr(model, "module", model)


def _grad(p):
    return p.main_grad if hasattr(p, "main_grad") else p.grad


def _all_reduce_coalesced(grads, group) -> None:
    grads = [g for g in grads if g is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _allreduce_sequence_parallel_grads(model_chunks) -> None:
    """Norm weights/biases see only this rank's tokens under SP: sum their grads over the TP group."""
    if ps.get_tensor_model_parallel_world_size() == 1:
        return
    grads = [_grad(p) for m in model_chunks for p in _unwrap(m).parameters()
             if getattr(p, "sequence_parallel", False) and p.requires_grad]
    _all_reduce_coalesced(grads, ps.get_tensor_model_parallel_group())


def _allreduce_embedding_grads(model_chunks) -> None:
    """First and last stage each hold the tied word embedding; summing their grads keeps them equal."""
    if ps.get_pipeline_model_parallel_world_size() == 1 or not ps.is_rank_in_embedding_group(ignore_virtual=True):
        return
    if ps.is_pipeline_first_stage(ignore_virtual=True):
        model = _unwrap(model_chunks[0])
    else:
        model = _unwrap(model_chunks[-1])
    if not getattr(model, "share_embeddings_and_output_weights", False):
        return
    weight = model.shared_embedding_or_output_weight()
    dist.all_reduce(_grad(weight), group=ps.get_embedding_group())


def finalize_model_grads(model, num_tokens=None, pg_collection=None, force_all_reduce: bool = False) -> None:
    """Megatron's signature (``model``: the list of model chunks). Refused by name: ``num_tokens`` (the per-token
    loss normalisation of ``calculate_per_token_loss``), a ``pg_collection`` whose groups are not parallel_state's,
    and ``force_all_reduce=True`` (an all-reduce where the distributed optimizer reduce-scatters)."""
    model_chunks = model
    if force_all_reduce:
        raise ValueError("finalize_model_grads: force_all_reduce=True is not supported by mega_par (the DP sync is "
                         "the buckets' own: all-reduce, or reduce-scatter with the distributed optimizer)")
    if num_tokens is not None:
        raise ValueError("finalize_model_grads: num_tokens (calculate_per_token_loss) is not supported by mega_par")
    if pg_collection is not None and getattr(pg_collection, "tp", None) is not ps.get_tensor_model_parallel_group():
        raise ValueError("finalize_model_grads: pg_collection.tp is not parallel_state's tp group; mega_par syncs "
                         "over parallel_state's groups only")
    if not isinstance(model_chunks, (list, tuple)):
        raise TypeError(f"finalize_model_grads expects a list of model chunks, got {type(model_chunks).__name__}")
    for m in model_chunks:
        if hasattr(m, "finish_grad_sync"):
            m.finish_grad_sync()
    _allreduce_sequence_parallel_grads(model_chunks)
    _allreduce_embedding_grads(model_chunks)
