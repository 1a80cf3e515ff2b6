"""The built-in comm hooks: plain averaging, and averaging in fp16 / bf16 to halve the bytes sent.

torch's torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py, same names and signatures
(``hook(process_group, bucket) -> Future[Tensor]``), written as torch's are: an async all-reduce whose future
is chained with ``then``; ``register_comm_hook(group, allreduce_hook)`` reduces exactly as no hook does.
"""

from __future__ import annotations

import torch

from pt_dist import distributed_c10d as c10d

__all__ = ["allreduce_hook", "bf16_compress_hook", "bf16_compress_wrapper", "fp16_compress_hook",
           "fp16_compress_wrapper"]


def _group(process_group):
    return process_group if process_group is not None else c10d.group.WORLD


def _allreduce_fut(process_group, tensor: torch.Tensor) -> torch.futures.Future:
    """Average ``tensor`` in place: divide first, then sum (as DDP without a hook)."""
    group = _group(process_group)
    tensor.div_(group.size())
    return c10d.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def allreduce_hook(process_group, bucket) -> torch.futures.Future:
    """The bucket averaged over the group: what DDP does without a hook."""
    return _allreduce_fut(process_group, bucket.buffer())


def _compress_hook(dtype: torch.dtype, process_group, bucket) -> torch.futures.Future:
    group = _group(process_group)
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(group.size())  # divide before summing, so fp16 does not overflow

    def decompress(fut):
        return buffer.copy_(fut.value()[0])
    return c10d.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)


def fp16_compress_hook(process_group, bucket) -> torch.futures.Future:
    """Cast the bucket to float16 (divided by the group size), all-reduce that, cast the result back."""
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group, bucket) -> torch.futures.Future:
    """As ``fp16_compress_hook`` in bfloat16: fp32's range, fewer mantissa bits."""
    return _compress_hook(torch.bfloat16, process_group, bucket)


def _compress_wrapper(dtype: torch.dtype, hook):
    def wrapped(hook_state, bucket) -> torch.futures.Future:
        bucket.set_buffer(bucket.buffer().to(dtype))
        fut = hook(hook_state, bucket)

        def decompress(fut):
            return bucket.buffer().copy_(fut.value())  # the low-precision buffer; DDP casts it into the bucket
        return fut.then(decompress)
    wrapped.__name__ = f"{dtype}_compress_wrapper({getattr(hook, '__name__', hook)})".replace("torch.", "")
    return wrapped


def fp16_compress_wrapper(hook):
    """``hook`` run on a float16 copy of the bucket (``fp16_compress_wrapper(powerSGD_hook)``)."""
    return _compress_wrapper(torch.float16, hook)


def bf16_compress_wrapper(hook):
    return _compress_wrapper(torch.bfloat16, hook)
