"""Pipeline schedules (``megatron/core/pipeline_parallel/schedules.py``).

* ``forward_backward_no_pipelining``: one stage, gradient accumulation over micro-batches.
* ``forward_backward_pipelining_without_interleaving``: PipeDream-Flush 1F1B (Narayanan et al.,
  arXiv 2104.04473 §2.2): ``p - rank - 1`` warm-up forwards, then one-forward-one-backward, then cool-down;
  at most ``p`` micro-batches' activations are alive. Bubble fraction ``(p - 1) / (m + p - 1)``.
* ``forward_backward_pipelining_with_interleaving``: each stage holds ``v`` model chunks (§2.2.2),
  shrinking the bubble to ``(p - 1) / (v * m)`` of the ideal time.

``forward_step_func(data_iterator, model) -> (output_tensor, loss_func)``; on the last stage
``loss_func(output_tensor)`` returns ``(loss, logged_dict)`` (the loss is divided by the number of
micro-batches) or ``(loss, num_tokens, logged_dict)`` (divided by the tokens, then the micro-batches). As in
Megatron, the schedule calls only the hooks the model's config names: ``config.no_sync_func`` around the
non-final micro-batches (here, without one, the model's own ``no_sync``), ``config.grad_scale_func`` on the
loss, and after the last backward ``config.finalize_model_grads_func`` (Megatron's training, and
``mega_par.training``, set it to ``finalize_model_grads``; a caller that does not calls it itself).

With ``config.deallocate_pipeline_outputs`` a stage's output keeps only its autograd graph once it has been
sent downstream (``deallocate_output_tensor``), and ``custom_backward`` runs its backward from that graph:
what a stage holds for an in-flight micro-batch is then only what autograd saved. ``seq_length=None``
(or ``config.variable_seq_lengths``) makes every message carry its shape, so micro-batches may differ in length.
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd.variable import Variable

from mega_par import parallel_state as ps
from mega_par.pipeline_parallel import p2p_communication as p2p


def get_forward_backward_func():
    """The schedule matching the current parallel state, as Megatron selects it."""
    if ps.get_pipeline_model_parallel_world_size() > 1:
        if ps.get_virtual_pipeline_model_parallel_world_size() is not None:
            return forward_backward_pipelining_with_interleaving
        return forward_backward_pipelining_without_interleaving
    return forward_backward_no_pipelining


def _no_sync(model):
    no_sync_func = getattr(_config(model), "no_sync_func", None)
    if no_sync_func is not None:
        return no_sync_func()
    return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def deallocate_output_tensor(out, deallocate_pipeline_outputs: bool = False) -> None:
    """Pseudo-free ``out.data`` (Megatron's): replace it by one element once it has been sent; the
    tensor's ``grad_fn`` is all its backward needs. Freeing a view would free nothing, so that is an error."""
    if out is None or not deallocate_pipeline_outputs:
        return
    if not torch.is_tensor(out):
        raise TypeError(f"deallocate_output_tensor expects a tensor, got {type(out).__name__}")
    if out._base is not None:
        raise ValueError(f"deallocate_output_tensor: the stage output (shape {tuple(out.shape)}) is a view of "
                         "another tensor, so freeing it frees nothing; return a fresh tensor from the stage")
    out.data = torch.empty((1,), device=out.device, dtype=out.dtype)


def custom_backward(output, grad_output) -> None:
    """Backward through a deallocated output by calling the autograd engine directly (Megatron's):
    ``torch.autograd.backward`` would reject a 1-element output with a full-size gradient."""
    if grad_output is None:  # the last stage's loss
        grad_output = torch.ones_like(output, memory_format=torch.preserve_format)
    Variable._execution_engine.run_backward(tensors=(output,), grad_tensors=(grad_output,), keep_graph=False,
                                            create_graph=False, inputs=(), allow_unreachable=True,
                                            accumulate_grad=True)


def _config(model):
    return model.config if hasattr(model, "config") else model.module.config


def _deallocate(model) -> bool:
    return bool(getattr(_config(model), "deallocate_pipeline_outputs", False))


def forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor, losses_reduced,
                 forward_only=False, collect_non_loss_data=False):
    model.set_input_tensor(input_tensor)
    output_tensor, loss_func = forward_step_func(data_iterator, model)
    if not ps.is_pipeline_last_stage():
        return output_tensor
    if collect_non_loss_data:  # Megatron's: whatever loss_func returns for non-loss data is collected
        losses_reduced.append(loss_func(output_tensor, non_loss_data=True))
        return output_tensor
    outputs = loss_func(output_tensor)
    if len(outputs) == 3:
        loss, num_tokens, logged = outputs
        loss = loss / torch.clamp(torch.as_tensor(num_tokens), min=1)
    elif len(outputs) == 2:
        loss, logged = outputs
    else:
        raise ValueError(f"loss_func must return (loss, logged) or (loss, num_tokens, logged), got {len(outputs)} "
                         "values")
    losses_reduced.append(logged)
    loss = loss / num_microbatches
    grad_scale_func = getattr(_config(model), "grad_scale_func", None)
    if grad_scale_func is not None and not forward_only:
        loss = grad_scale_func(loss)
    return loss


def backward_step(input_tensor, output_tensor, output_tensor_grad, deallocate_pipeline_outputs: bool = False):
    """Backprop through this stage; returns the gradient of its input (None on the first stage)."""
    if input_tensor is not None:
        input_tensor.retain_grad()
    if deallocate_pipeline_outputs:
        custom_backward(output_tensor, output_tensor_grad)
    else:
        torch.autograd.backward(output_tensor, grad_tensors=output_tensor_grad)
    return None if input_tensor is None else input_tensor.grad


def _finish(model_chunks, forward_only):
    finalize = getattr(_config(model_chunks[0]), "finalize_model_grads_func", None)
    if finalize is not None and not forward_only:
        finalize(model_chunks)


def _pipeline_dtype(model):
    """The dtype stages exchange: ``config.pipeline_dtype`` (None: the default dtype, as Megatron's empty buffers)."""
    return getattr(_config(model), "pipeline_dtype", None) or torch.get_default_dtype()


def _check(num_microbatches, seq_length, micro_batch_size, decoder_seq_length=None, adjust_tensor_shapes_fn=None):
    """``seq_length`` / ``micro_batch_size`` may be None: unused without pipelining, and with it the shapes
    are then sent along with the tensors (as Megatron's ``variable_seq_lengths``). ``decoder_seq_length``
    is for encoder-decoder models, so a decoder-only stack ignores it, as Megatron's schedules do."""
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"num_microbatches must be a positive int, got {num_microbatches!r}")
    for name, v in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size),
                    ("decoder_seq_length", decoder_seq_length)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive int or None, got {v!r}")
    if adjust_tensor_shapes_fn is not None:
        raise ValueError("adjust_tensor_shapes_fn is not supported by mega_par's schedules")


def _tensor_shape(model, seq_length, micro_batch_size):
    """``(s/tp with SP, b, h)`` of the activations between stages, or None: exchange shapes per message."""
    config = _config(model)
    if seq_length is None or micro_batch_size is None or getattr(config, "variable_seq_lengths", False):
        return None
    tp = ps.get_tensor_model_parallel_world_size()
    if config.sequence_parallel and seq_length % tp:
        raise ValueError(f"seq_length ({seq_length}) must be divisible by the TP size ({tp}) with sequence_parallel")
    seq = seq_length // tp if config.sequence_parallel else seq_length
    return (seq, micro_batch_size, config.hidden_size)


def forward_backward_no_pipelining(*, forward_step_func, data_iterator, model, num_microbatches: int,
                                   seq_length: int | None, micro_batch_size: int | None,
                                   decoder_seq_length: int | None = None, forward_only: bool = False,
                                   collect_non_loss_data: bool = False, first_val_step: bool | None = None,
                                   adjust_tensor_shapes_fn=None):
    """``first_val_step`` only marks the first micro-batch for fp8 weight caching in Megatron; no effect here."""
    _check(num_microbatches, seq_length, micro_batch_size, decoder_seq_length, adjust_tensor_shapes_fn)
    model_chunks = _as_list(model)
    if len(model_chunks) != 1:
        raise ValueError(f"no-pipelining schedule needs one model chunk, got {len(model_chunks)}")
    model, data_iterator = model_chunks[0], _as_list(data_iterator)[0]
    losses = []
    # gradients are synced once, after the last micro-batch
    with _no_sync(model):
        for _ in range(num_microbatches - 1):
            out = forward_step(forward_step_func, data_iterator, model, num_microbatches, None, losses, forward_only,
                               collect_non_loss_data)
            if not forward_only:
                backward_step(None, out, None)
    out = forward_step(forward_step_func, data_iterator, model, num_microbatches, None, losses, forward_only,
                       collect_non_loss_data)
    if not forward_only:
        backward_step(None, out, None)
    _finish(model_chunks, forward_only)
    return losses


def forward_backward_pipelining_without_interleaving(*, forward_step_func, data_iterator, model,
                                                     num_microbatches: int, seq_length: int | None,
                                                     micro_batch_size: int | None,
                                                     decoder_seq_length: int | None = None, forward_only: bool = False,
                                                     collect_non_loss_data: bool = False,
                                                     first_val_step: bool | None = None, adjust_tensor_shapes_fn=None):
    _check(num_microbatches, seq_length, micro_batch_size, decoder_seq_length, adjust_tensor_shapes_fn)
    model_chunks = _as_list(model)
    if len(model_chunks) != 1:
        raise ValueError(f"1F1B needs one model chunk per stage, got {len(model_chunks)}; use interleaving")
    model, data_iterator = model_chunks[0], _as_list(data_iterator)[0]
    shape, dtype = _tensor_shape(model, seq_length, micro_batch_size), _pipeline_dtype(model)
    pp, rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    num_warmup = min(pp - rank - 1, num_microbatches)
    num_remaining = num_microbatches - num_warmup
    input_tensors, output_tensors, losses = [], [], []
    dealloc = _deallocate(model)
    free_sent = dealloc and not ps.is_pipeline_last_stage()  # the last stage's output (the loss) is not sent
    sync = _no_sync(model)
    sync.__enter__()

    for _ in range(num_warmup):
        input_tensor = p2p.recv_forward(shape, dtype)
        output_tensor = forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor, losses,
                                     forward_only, collect_non_loss_data)
        p2p.send_forward(output_tensor, shape)
        deallocate_output_tensor(output_tensor, free_sent)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)

    input_tensor = p2p.recv_forward(shape, dtype) if num_remaining > 0 else None
    for i in range(num_remaining):
        last_iteration = i == num_remaining - 1
        output_tensor = forward_step(forward_step_func, data_iterator, model, num_microbatches, input_tensor, losses,
                                     forward_only, collect_non_loss_data)
        if forward_only:
            p2p.send_forward(output_tensor, shape)
            input_tensor = None if last_iteration else p2p.recv_forward(shape, dtype)
            continue
        output_tensor_grad = p2p.send_forward_recv_backward(output_tensor, shape, dtype)
        deallocate_output_tensor(output_tensor, free_sent)
        input_tensors.append(input_tensor)
        output_tensors.append(output_tensor)
        input_tensor, output_tensor = input_tensors.pop(0), output_tensors.pop(0)
        if last_iteration and num_warmup == 0:
            sync.__exit__(None, None, None)  # the very last backward: let DDP mark grads ready
        input_tensor_grad = backward_step(input_tensor, output_tensor, output_tensor_grad, dealloc)
        if last_iteration:
            input_tensor = None
            p2p.send_backward(input_tensor_grad, shape)
        else:
            input_tensor = p2p.send_backward_recv_forward(input_tensor_grad, shape, dtype)

    if not forward_only:
        for i in range(num_warmup):
            if i == num_warmup - 1:
                sync.__exit__(None, None, None)
            input_tensor, output_tensor = input_tensors.pop(0), output_tensors.pop(0)
            output_tensor_grad = p2p.recv_backward(shape, dtype)
            input_tensor_grad = backward_step(input_tensor, output_tensor, output_tensor_grad, dealloc)
            p2p.send_backward(input_tensor_grad, shape)
    else:
        sync.__exit__(None, None, None)
    _finish(model_chunks, forward_only)
    return losses


def forward_backward_pipelining_with_interleaving(*, forward_step_func, data_iterator, model,
                                                  num_microbatches: int, seq_length: int | None,
                                                  micro_batch_size: int | None,
                                                  decoder_seq_length: int | None = None, forward_only: bool = False,
                                                  collect_non_loss_data: bool = False,
                                                  first_val_step: bool | None = None, adjust_tensor_shapes_fn=None):
    """Interleaved 1F1B over ``vpp`` model chunks per stage; micro-batches advance in groups of ``pp``."""
    _check(num_microbatches, seq_length, micro_batch_size, decoder_seq_length, adjust_tensor_shapes_fn)
    model_chunks, iterators = _as_list(model), _as_list(data_iterator)
    pp, rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    vpp = ps.get_virtual_pipeline_model_parallel_world_size()
    if vpp is None or len(model_chunks) != vpp or len(iterators) != vpp:
        raise ValueError(f"interleaving needs virtual_pipeline_model_parallel_size model chunks and data iterators, "
                         f"got vpp={vpp}, {len(model_chunks)} chunks, {len(iterators)} iterators")
    if num_microbatches % pp:
        raise ValueError(f"interleaved schedule needs num_microbatches ({num_microbatches}) divisible by "
                         f"pipeline_model_parallel_size ({pp})")
    shape, dtype = _tensor_shape(model_chunks[0], seq_length, micro_batch_size), _pipeline_dtype(model_chunks[0])
    total = num_microbatches * vpp
    all_warmup = num_microbatches == pp or forward_only
    num_warmup = total if all_warmup else min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    num_remaining = total - num_warmup
    input_tensors = [[] for _ in range(vpp)]
    output_tensors = [[] for _ in range(vpp)]
    output_tensor_grads = [[] for _ in range(vpp)]
    losses = []
    dealloc = _deallocate(model_chunks[0])

    def chunk_id(k, forward):
        c = (k % (pp * vpp)) // pp
        return c if forward else vpp - 1 - c

    def forward_helper(k):
        c = chunk_id(k, True)
        ps.set_virtual_pipeline_model_parallel_rank(c)
        if ps.is_pipeline_first_stage() and len(input_tensors[c]) == len(output_tensors[c]):
            input_tensors[c].append(None)
        out = forward_step(forward_step_func, iterators[c], model_chunks[c], num_microbatches, input_tensors[c][-1],
                           losses, forward_only, collect_non_loss_data)
        output_tensors[c].append(out)
        if forward_only:  # nothing to backprop: drop references as we go
            input_tensors[c].pop()
            output_tensors[c].pop()
        return out

    def backward_helper(k):
        c = chunk_id(k, False)
        ps.set_virtual_pipeline_model_parallel_rank(c)
        if ps.is_pipeline_last_stage() and not output_tensor_grads[c]:
            output_tensor_grads[c].append(None)
        return backward_step(input_tensors[c].pop(0), output_tensors[c].pop(0), output_tensor_grads[c].pop(0),
                             dealloc)

    syncs = [_no_sync(m) for m in model_chunks]
    for s in syncs:
        s.__enter__()
    ps.set_virtual_pipeline_model_parallel_rank(0)
    input_tensors[0].append(p2p.recv_forward(shape, dtype))
    for k in range(num_warmup):
        out = forward_helper(k)
        next_c = chunk_id(k + 1, True)
        recv_prev = not (ps.is_pipeline_first_stage(ignore_virtual=True) and next_c == 0) and k != total - 1
        if ps.is_pipeline_last_stage():
            out = None
        if k == num_warmup - 1 and not all_warmup:
            recv_next = not ps.is_pipeline_last_stage(ignore_virtual=True)
            inp, grad = p2p.send_forward_backward_recv_forward_backward(out, None, recv_prev, recv_next, shape, dtype)
            output_tensor_grads[vpp - 1].append(grad)
        else:
            inp = p2p.send_forward_recv_forward(out, recv_prev, shape, dtype)
        deallocate_output_tensor(out, dealloc and not forward_only)  # None on the last virtual stage
        input_tensors[next_c].append(inp)

    for k in range(num_remaining):
        fk, bk = k + num_warmup, k
        out = forward_helper(fk)
        if k == num_remaining - 1:
            for s in syncs:
                s.__exit__(None, None, None)
        in_grad = backward_helper(bk)
        ps.set_virtual_pipeline_model_parallel_rank(chunk_id(fk, True))
        if ps.is_pipeline_last_stage():
            out = None
        ps.set_virtual_pipeline_model_parallel_rank(chunk_id(bk, False))
        if ps.is_pipeline_first_stage():
            in_grad = None
        recv_prev = True
        if ps.is_pipeline_first_stage(ignore_virtual=True):
            next_fc = chunk_id(fk - (pp - 1), True)
            recv_prev = next_fc != vpp - 1
            next_fc += 1
        else:
            next_fc = chunk_id(fk + 1, True)
        recv_next = True
        if ps.is_pipeline_last_stage(ignore_virtual=True):
            next_bc = chunk_id(bk - (pp - 1), False)
            recv_next = next_bc != 0
            next_bc -= 1
        else:
            next_bc = chunk_id(bk + 1, False)
        if k == num_remaining - 1:
            recv_prev = False
        inp, grad = p2p.send_forward_backward_recv_forward_backward(out, in_grad, recv_prev, recv_next, shape, dtype)
        deallocate_output_tensor(out, dealloc)
        if recv_prev:
            input_tensors[next_fc].append(inp)
        if recv_next:
            output_tensor_grads[next_bc].append(grad)

    if not forward_only:
        if all_warmup:
            output_tensor_grads[vpp - 1].append(p2p.recv_backward(shape, dtype) if not ps.is_pipeline_last_stage(
                ignore_virtual=True) else None)
        if num_remaining == 0:
            for s in syncs:
                s.__exit__(None, None, None)
        for k in range(num_remaining, total):
            in_grad = backward_helper(k)
            next_bc = chunk_id(k + 1, False)
            recv_next = not (ps.is_pipeline_last_stage(ignore_virtual=True) and next_bc == vpp - 1) and k != total - 1
            if ps.is_pipeline_first_stage():
                in_grad = None
            output_tensor_grads[next_bc].append(p2p.send_backward_recv_backward(in_grad, recv_next, shape, dtype))
    else:
        for s in syncs:
            s.__exit__(None, None, None)
    ps.set_virtual_pipeline_model_parallel_rank(0)
    _finish(model_chunks, forward_only)
    return losses
