"""Collectives on picklable Python objects: torch.distributed's ``all_gather_object`` and friends.

Built on the tensor collectives, as torch builds them: each object is pickled into a uint8 tensor, the
ranks first agree on the byte counts (a collective on int64 sizes), then move the bytes padded to the
longest. Used for what is not a tensor: configs, a checkpoint's metadata, per-rank statistics, and (with
``send_object_list`` / ``recv_object_list``) the shapes a pipeline stage announces to the next.
As in torch, unpickling runs code the sender chose: use these only among the ranks of your own job
(the native backends' connections already require the job's secret), or pass ``weights_only=True``:
objects then travel through ``torch.save`` and come back through ``torch.load(weights_only=True)``, which
rebuilds tensors and plain containers and refuses anything else.
"""

from __future__ import annotations

import io
import pickle

import torch

from pt_dist import distributed_c10d as c10d
from pt_dist._infra.wire import byte_view

__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "recv_object_list", "scatter_object_list",
           "send_object_list"]


def _device(group) -> torch.device:
    """Where the byte tensors live: NCCL moves only CUDA tensors, every other backend CPU ones."""
    if c10d.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _to_bytes(obj, weights_only: bool = False) -> torch.Tensor:
    if weights_only:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
    else:
        data = pickle.dumps(obj)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _to_object(t: torch.Tensor, size: int, weights_only: bool = False):
    data = byte_view(t[:size].cpu().contiguous())
    return torch.load(io.BytesIO(data), weights_only=True) if weights_only else pickle.loads(data)


def _padded(payloads: list[torch.Tensor], width: int, device) -> torch.Tensor:
    """The payloads one after another, each zero-padded to ``width`` bytes."""
    out = torch.zeros(len(payloads), width, dtype=torch.uint8)
    for row, p in zip(out, payloads):
        row[:p.numel()] = p
    return out.view(-1).to(device)


def _sizes(group, mine: int, device) -> list[int]:
    """Every rank's byte count, by group rank."""
    sizes = torch.zeros(c10d.get_world_size(group), dtype=torch.int64, device=device)
    c10d.all_gather_into_tensor(sizes, torch.tensor([mine], dtype=torch.int64, device=device), group=group)
    return sizes.tolist()


def _brief(x) -> str:
    return f"a {type(x).__name__} of {len(x)}" if isinstance(x, (list, tuple)) else repr(x)[:80]


def _root_only(op: str, what: str, objects, root: int, group, ignored_elsewhere: bool = False) -> tuple[int, bool]:
    """Check, as torch does, that the root passes ``objects``, one per rank, and (unless torch ignores them there)
    that the other ranks do not; (group size, am I the root)."""
    c10d.get_group_rank(group, root)  # the root must be in the group, before any communication
    world, mine = c10d.get_world_size(group), c10d.get_rank() == root
    if mine and (not isinstance(objects, list) or len(objects) != world):
        raise ValueError(f"{op}: {what} on rank {root} must be a list of group size={world} entries, got "
                         f"{_brief(objects)}")
    if not mine and objects and not ignored_elsewhere:
        raise ValueError(f"{op}: {what} must NOT be given on rank {c10d.get_rank()}, only on rank {root}")
    return world, mine


def _root(group, rank, group_rank, what: str, default: int | None = 0) -> int:
    """The global rank of a peer named either way (torch's ``src``/``dst`` or ``group_src``/``group_dst``)."""
    return c10d.get_global_rank(group, c10d._peer(group, rank, group_rank, what, default))


def all_gather_object(object_list: list, obj, group=None, weights_only: bool = False) -> None:
    """``object_list[i]`` = rank i's ``obj`` on every rank; ``object_list`` has one slot per rank of the group."""
    if c10d._rank_not_in_group(group, "all_gather_object"):
        return
    world = c10d.get_world_size(group)
    if not isinstance(object_list, list) or len(object_list) != world:
        raise ValueError(f"all_gather_object: object_list must be a list of group size={world} slots, got "
                         f"{_brief(object_list)}")
    device = _device(group)
    payload = _to_bytes(obj, weights_only)
    sizes = _sizes(group, payload.numel(), device)
    width = max(sizes)
    out = torch.empty(world * width, dtype=torch.uint8, device=device)
    c10d.all_gather_into_tensor(out, _padded([payload], width, device), group=group)
    for i, size in enumerate(sizes):
        object_list[i] = _to_object(out[i * width:(i + 1) * width], size, weights_only)


def gather_object(obj, object_gather_list: list | None = None, dst: int | None = None, group=None,
                  group_dst: int | None = None, weights_only: bool = False) -> None:
    """Every rank's ``obj`` into ``object_gather_list`` on ``dst`` (a global rank); other ranks pass ``None``."""
    if c10d._rank_not_in_group(group, "gather_object"):
        return
    dst = _root(group, dst, group_dst, "dst")
    world, mine = _root_only("gather_object", "object_gather_list", object_gather_list, dst, group)
    device = _device(group)
    payload = _to_bytes(obj, weights_only)
    sizes = _sizes(group, payload.numel(), device)
    width = max(sizes)
    outs = [torch.empty(width, dtype=torch.uint8, device=device) for _ in range(world)] if mine else None
    c10d.gather(_padded([payload], width, device), outs, dst=dst, group=group)
    for i, size in enumerate(sizes if mine else []):
        object_gather_list[i] = _to_object(outs[i], size, weights_only)


def broadcast_object_list(object_list: list, src: int | None = None, group=None, device=None,
                          group_src: int | None = None, weights_only: bool = False) -> None:
    """Replace every entry of ``object_list`` with ``src``'s (a global rank); every rank passes a list of the
    same length (the non-source entries are placeholders). ``device``: where the bytes travel (default: CPU,
    or the current GPU under NCCL)."""
    if c10d._rank_not_in_group(group, "broadcast_object_list"):
        return
    if not isinstance(object_list, list) or not object_list:
        raise ValueError(f"broadcast_object_list: object_list must be a non-empty list, got {_brief(object_list)}")
    src = _root(group, src, group_src, "src")
    device, mine = torch.device(device) if device is not None else _device(group), c10d.get_rank() == src
    payloads = [_to_bytes(o, weights_only) for o in object_list] if mine else []
    sizes = torch.tensor([p.numel() for p in payloads] if mine else [0] * len(object_list), dtype=torch.int64,
                         device=device)
    c10d.broadcast(sizes, src=src, group=group)
    data = torch.cat(payloads).to(device) if mine else torch.empty(int(sizes.sum()), dtype=torch.uint8,
                                                                    device=device)
    c10d.broadcast(data, src=src, group=group)
    if not mine:
        data, at = data.cpu(), 0
        for i, size in enumerate(sizes.tolist()):
            object_list[i] = _to_object(data[at:at + size], size, weights_only)
            at += size


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int | None = None, group=None, group_src: int | None = None,
                        weights_only: bool = False) -> None:
    """``scatter_object_input_list[i]`` on ``src`` (a global rank) into ``scatter_object_output_list[0]`` on the
    group's rank i."""
    if c10d._rank_not_in_group(group, "scatter_object_list"):
        return
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("scatter_object_list: scatter_object_output_list must be a non-empty list (its first "
                         f"entry receives the object), got {_brief(scatter_object_output_list)}")
    src = _root(group, src, group_src, "src")
    world, mine = _root_only("scatter_object_list", "scatter_object_input_list", scatter_object_input_list, src,
                             group, ignored_elsewhere=True)  # "can be any list on non-src ranks" (torch's docs)
    device = _device(group)
    payloads = [_to_bytes(o, weights_only) for o in scatter_object_input_list] if mine else []
    head = torch.tensor([p.numel() for p in payloads] if mine else [0] * world, dtype=torch.int64, device=device)
    c10d.broadcast(head, src=src, group=group)  # every rank learns every size, so the padding agrees
    sizes = head.tolist()
    width = max(sizes)
    out = torch.empty(width, dtype=torch.uint8, device=device)
    ins = list(_padded(payloads, width, device).view(world, width)) if mine else None
    c10d.scatter(out, ins, src=src, group=group)
    scatter_object_output_list[0] = _to_object(out, sizes[c10d.get_rank(group)], weights_only)


def send_object_list(object_list: list, dst: int | None = None, group=None, device=None,
                     group_dst: int | None = None, use_batch: bool = False, weights_only: bool = False) -> None:
    """Send every object of ``object_list`` to ``dst`` (a global rank), whose ``recv_object_list`` passes a list of
    the same length: first the byte counts, then the bytes. ``use_batch`` is accepted for torch's signature
    (the two messages already go out back to back)."""
    if c10d._rank_not_in_group(group, "send_object_list"):
        return
    if not isinstance(object_list, list) or not object_list:
        raise ValueError(f"send_object_list: object_list must be a non-empty list, got {_brief(object_list)}")
    dst = _root(group, dst, group_dst, "dst", default=None)
    device = torch.device(device) if device is not None else _device(group)
    payloads = [_to_bytes(o, weights_only) for o in object_list]
    c10d.send(torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device), dst, group=group)
    c10d.send(torch.cat(payloads).to(device), dst, group=group)


def recv_object_list(object_list: list, src: int | None = None, group=None, device=None,
                     group_src: int | None = None, use_batch: bool = False, weights_only: bool = False) -> int:
    """Fill ``object_list`` (one placeholder per object sent) from ``src``'s ``send_object_list``; returns ``src``
    as a global rank, as torch does."""
    if c10d._rank_not_in_group(group, "recv_object_list"):
        return -1
    if not isinstance(object_list, list) or not object_list:
        raise ValueError(f"recv_object_list: object_list must be a non-empty list, got {_brief(object_list)}")
    src = _root(group, src, group_src, "src", default=None)
    device = torch.device(device) if device is not None else _device(group)
    sizes = torch.empty(len(object_list), dtype=torch.int64, device=device)
    c10d.recv(sizes, src, group=group)
    data = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
    c10d.recv(data, src, group=group)
    data, at = data.cpu(), 0
    for i, size in enumerate(sizes.tolist()):
        object_list[i] = _to_object(data[at:at + size], size, weights_only)
        at += size
    return src
