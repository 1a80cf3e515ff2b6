"""Point-to-point exchange of activations and gradients between pipeline stages (``p2p_communication.py``).

Every exchange goes through ``_communicate``: all sends and receives of one step are posted
non-blocking, then awaited, so neighbouring stages that both send and receive never deadlock.
Activations and gradients travel with different tags, which keeps them apart when a two-stage
interleaved pipeline wraps around (stage 0's previous and next rank are the same process).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps

_TAG_FORWARD, _TAG_BACKWARD = 1, 2


def _communicate(tensor_send_next, tensor_send_prev, recv_prev: bool, recv_next: bool, tensor_shape,
                 dtype=torch.float32):
    """Send to next/prev and receive from prev/next in one step; returns ``(from_prev, from_next)``."""
    group = ps.get_pipeline_model_parallel_group()
    prev_rank, next_rank = ps.get_pipeline_model_parallel_prev_rank(), ps.get_pipeline_model_parallel_next_rank()
    # NCCL moves device tensors; gloo (CPU) host tensors
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    from_prev = torch.empty(tensor_shape, dtype=dtype, device=device, requires_grad=True) if recv_prev else None
    from_next = torch.empty(tensor_shape, dtype=dtype, device=device, requires_grad=True) if recv_next else None
    works = []
    # post the receives first so each peer's send has a posted receive to land in
    if from_prev is not None:
        works.append(dist.irecv(from_prev.data, src=prev_rank, group=group, tag=_TAG_FORWARD))
    if from_next is not None:
        works.append(dist.irecv(from_next.data, src=next_rank, group=group, tag=_TAG_BACKWARD))
    if tensor_send_next is not None:
        works.append(dist.isend(tensor_send_next.detach().contiguous(), dst=next_rank, group=group, tag=_TAG_FORWARD))
    if tensor_send_prev is not None:
        works.append(dist.isend(tensor_send_prev.detach().contiguous(), dst=prev_rank, group=group,
                                tag=_TAG_BACKWARD))
    for w in works:
        w.wait()
    return from_prev, from_next


def recv_forward(tensor_shape, dtype=torch.float32):
    if ps.is_pipeline_first_stage():
        return None
    return _communicate(None, None, True, False, tensor_shape, dtype)[0]


def recv_backward(tensor_shape, dtype=torch.float32):
    if ps.is_pipeline_last_stage():
        return None
    return _communicate(None, None, False, True, tensor_shape, dtype)[1]


def send_forward(output_tensor, tensor_shape=None) -> None:
    if not ps.is_pipeline_last_stage():
        _communicate(output_tensor, None, False, False, tensor_shape)


def send_backward(input_tensor_grad, tensor_shape=None) -> None:
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
