"""Point-to-point exchange of activations and gradients between pipeline stages (``p2p_communication.py``).

Every exchange goes through ``_communicate``: the sends and receives of one step are posted together as one
``batch_isend_irecv`` (NCCL runs them as a group, so two stages that both send and receive never deadlock),
then awaited. No message carries a tag: NCCL ignores tags and matches the messages between two ranks in the
order they were posted. So the order is fixed by direction, the same on every rank: first the forward
direction (send to next, receive from prev: activations), then the backward direction (send to prev,
receive from next: gradients). When a two-stage interleaved pipeline wraps around, a stage's previous and
next rank are the same process; each side then posts activation-then-gradient, and the pairs still match.
(Megatron's batched order puts send-prev first, which is why it refuses pp=2 with interleaving.)

Every function takes the schedule's ``tensor_shape``, senders too: ``None`` is Megatron's ``variable_seq_lengths``,
where each message is preceded by its shape (3 int64s), so both peers must agree on it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps


def _device(group):
    # NCCL moves device tensors; gloo (CPU) host tensors
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"


def _batched_p2p_ops(tensor_send_next, tensor_recv_prev, tensor_send_prev, tensor_recv_next, prev_rank, next_rank,
                     group) -> None:
    """Post the step's messages as one batch, forward direction first, and wait for all of them."""
    ops = []
    if tensor_send_next is not None:
        ops.append(dist.P2POp(dist.isend, tensor_send_next, next_rank, group))
    if tensor_recv_prev is not None:
        ops.append(dist.P2POp(dist.irecv, tensor_recv_prev, prev_rank, group))
    if tensor_send_prev is not None:
        ops.append(dist.P2POp(dist.isend, tensor_send_prev, prev_rank, group))
    if tensor_recv_next is not None:
        ops.append(dist.P2POp(dist.irecv, tensor_recv_next, next_rank, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _communicate_shapes(tensor_send_next, tensor_send_prev, recv_prev: bool, recv_next: bool, ranks, group, device):
    """Megatron's ``_communicate_shapes``: each receiver learns the shape of the tensor coming to it."""
    shape = lambda t: None if t is None else torch.tensor(t.shape, dtype=torch.int64, device=device)
    for t in (tensor_send_next, tensor_send_prev):
        if t is not None and t.dim() != 3:
            raise ValueError(f"pipeline tensors are [seq, batch, hidden]; got shape {tuple(t.shape)}")
    from_prev = torch.empty(3, dtype=torch.int64, device=device) if recv_prev else None
    from_next = torch.empty(3, dtype=torch.int64, device=device) if recv_next else None
    _batched_p2p_ops(shape(tensor_send_next), from_prev, shape(tensor_send_prev), from_next, *ranks, group)
    return (None if from_prev is None else from_prev.tolist()), (None if from_next is None else from_next.tolist())


def _communicate(tensor_send_next, tensor_send_prev, recv_prev: bool, recv_next: bool, tensor_shape,
                 dtype=torch.float32):
    """Send to next/prev and receive from prev/next in one step; returns ``(from_prev, from_next)``."""
    group = ps.get_pipeline_model_parallel_group()
    ranks = (ps.get_pipeline_model_parallel_prev_rank(), ps.get_pipeline_model_parallel_next_rank())
    device = _device(group)
    send_next = None if tensor_send_next is None else tensor_send_next.detach().contiguous()
    send_prev = None if tensor_send_prev is None else tensor_send_prev.detach().contiguous()
    if tensor_shape is None:
        prev_shape, next_shape = _communicate_shapes(send_next, send_prev, recv_prev, recv_next, ranks, group,
                                                     device)
    else:
        prev_shape = next_shape = tuple(tensor_shape)
        for what, t in (("output (sent to the next stage)", send_next), ("input gradient (sent back)", send_prev)):
            if t is not None and tuple(t.shape) != prev_shape:
                # the peer posted a buffer of tensor_shape: a different size would hang or corrupt the exchange
                raise ValueError(f"pipeline p2p: this stage's {what} has shape {tuple(t.shape)}, the schedule "
                                 f"exchanges {prev_shape} = (seq_length[/tp with SP], micro_batch_size, hidden); "
                                 "does a non-last stage compute the loss (post_process=True)?")
    from_prev = torch.empty(prev_shape, dtype=dtype, device=device, requires_grad=True) if recv_prev else None
    from_next = torch.empty(next_shape, dtype=dtype, device=device, requires_grad=True) if recv_next else None
    _batched_p2p_ops(send_next, None if from_prev is None else from_prev.data, send_prev,
                     None if from_next is None else from_next.data, *ranks, group)
    return from_prev, from_next


def recv_forward(tensor_shape, dtype=torch.float32):
    if ps.is_pipeline_first_stage():
        return None
    return _communicate(None, None, True, False, tensor_shape, dtype)[0]


def recv_backward(tensor_shape, dtype=torch.float32):
    if ps.is_pipeline_last_stage():
        return None
    return _communicate(None, None, False, True, tensor_shape, dtype)[1]


def send_forward(output_tensor, tensor_shape) -> None:
    if not ps.is_pipeline_last_stage():
        _communicate(output_tensor, None, False, False, tensor_shape)


def send_backward(input_tensor_grad, tensor_shape) -> None:
    if not ps.is_pipeline_first_stage():
        _communicate(None, input_tensor_grad, False, False, tensor_shape)


def send_forward_recv_backward(output_tensor, tensor_shape, dtype=torch.float32):
    if ps.is_pipeline_last_stage():
        return None
    return _communicate(output_tensor, None, False, True, tensor_shape, dtype)[1]


def send_backward_recv_forward(input_tensor_grad, tensor_shape, dtype=torch.float32):
    if ps.is_pipeline_first_stage():
        return None
    return _communicate(None, input_tensor_grad, True, False, tensor_shape, dtype)[0]


def send_forward_recv_forward(output_tensor, recv_prev: bool, tensor_shape, dtype=torch.float32):
    """Interleaved schedule: the caller decides (virtual-stage aware) what is sent and received."""
    return _communicate(output_tensor, None, recv_prev, False, tensor_shape, dtype)[0]


def send_backward_recv_backward(input_tensor_grad, recv_next: bool, tensor_shape, dtype=torch.float32):
    return _communicate(None, input_tensor_grad, False, recv_next, tensor_shape, dtype)[1]


def send_forward_backward_recv_forward_backward(output_tensor, input_tensor_grad, recv_prev: bool, recv_next: bool,
                                                tensor_shape, dtype=torch.float32):
    return _communicate(output_tensor, input_tensor_grad, recv_prev, recv_next, tensor_shape, dtype)
