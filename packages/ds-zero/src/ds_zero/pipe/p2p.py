"""Point-to-point transfers between adjacent stages (DeepSpeed's ``deepspeed/runtime/pipe/p2p.py`` and the
engine's ``_send_tensor_meta``/``_recv_tensor_meta``).

An activation is a tensor or a tuple of tensors. Its description (count, dtype, shape, requires_grad per
tensor) travels once, with the first micro-batch of a batch, as one small int64 tensor; later transfers
are just the data into buffers allocated from it. Sends are non-blocking (``isend``); the engine waits on
them before it frees what was sent, and posts each next receive (``irecv``) as soon as the previous one
arrived, so a neighbour's send finds it waiting instead of first trading ready notices with it (gloo).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
]
_MAX_META = 256


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def encode_meta(tensors) -> torch.Tensor:
    """``[count, (dtype, requires_grad, ndim, *shape) per tensor, ...]`` padded to a fixed length."""
    flat = [len(tensors)]
    for t in tensors:
        if not torch.is_tensor(t):
            raise TypeError(f"pipeline stages exchange tensors (or tuples of tensors), got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"pipeline activations of dtype {t.dtype} are not supported")
        flat += [_DTYPES.index(t.dtype), int(t.requires_grad), t.dim(), *t.shape]
    if len(flat) > _MAX_META:
        raise ValueError(f"activation description too long ({len(flat)} > {_MAX_META} ints)")
    return torch.tensor(flat + [0] * (_MAX_META - len(flat)), dtype=torch.int64)


def decode_meta(meta: torch.Tensor) -> list[tuple]:
    vals = meta.tolist()
    out, i = [], 1
    for _ in range(vals[0]):
        dtype, grad, ndim = _DTYPES[vals[i]], bool(vals[i + 1]), vals[i + 2]
        out.append((dtype, grad, tuple(vals[i + 3 : i + 3 + ndim])))
        i += 3 + ndim
    return out


class P2P:
    """Transfers with one neighbour stage, on the device the engine computes on."""

    def __init__(self, device: torch.device):
        self.device = device

    def send_meta(self, tensors, dst: int) -> None:
        dist.send(encode_meta(tensors).to(self.device), dst=dst)

    def recv_meta(self, src: int) -> list[tuple]:
        meta = torch.empty(_MAX_META, dtype=torch.int64, device=self.device)
        dist.recv(meta, src=src)
        return decode_meta(meta.cpu())

    def isend(self, tensors, dst: int) -> list:
        return [dist.isend(t.detach().contiguous(), dst=dst) for t in tensors]

    def recv_into(self, buffers, src: int) -> None:
        for b in buffers:
            dist.recv(b, src=src)

    def irecv(self, meta, src: int) -> tuple:
        """Post the receives of the next transfer now: ``(buffers, works)``, waited on when it is needed."""
        bufs = self.buffers(meta)
        return bufs, [dist.irecv(b, src=src) for b in bufs]

    def buffers(self, meta) -> tuple:
        return tuple(torch.empty(shape, dtype=dtype, device=self.device) for dtype, _, shape in meta)
