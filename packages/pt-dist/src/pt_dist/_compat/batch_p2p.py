"""Batched point-to-point: torch.distributed's ``P2POp`` and ``batch_isend_irecv``, what pipeline engines post.

A 1F1B pipeline stage sends activations forward and receives gradients back in the same step; posting
both at once (rather than a blocking send, then a receive) is what keeps neighbouring stages from
waiting on each other in a cycle. Each peer has its own send and receive channels, so the order of
sends and receives in a batch does not matter; two sends to one peer arrive in order.
"""

from __future__ import annotations

import torch

from pt_dist.distributed_c10d import GroupMember, _group, _peer, _rank_not_in_group, get_global_rank, irecv, isend

__all__ = ["P2POp", "batch_isend_irecv"]


class P2POp:
    """One send or receive of a ``batch_isend_irecv`` batch: ``op`` is ``isend`` or ``irecv``; ``peer`` is a global
    rank, ``group_peer`` the group's own."""

    def __init__(self, op, tensor: torch.Tensor, peer: int | None = None, group=None, tag: int = 0,
                 group_peer: int | None = None):
        if op not in (isend, irecv):
            raise ValueError(f"P2POp: op must be pt_dist.isend or pt_dist.irecv, got {op!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"P2POp: tensor must be a torch.Tensor, got {type(tensor).__name__}")
        # as torch's: no group means the default one, and a group_peer is also told as its global rank
        self.op, self.tensor, self.tag = op, tensor, tag
        self.group = GroupMember.WORLD if group is None else group
        self._named = peer, group_peer  # as given: batch_isend_irecv checks them
        if peer is None and group_peer is not None and self.group is not GroupMember.NON_GROUP_MEMBER:
            peer = get_global_rank(self.group, group_peer)
        self.peer, self.group_peer = peer, group_peer

    def __repr__(self) -> str:
        peer = f"peer={self.peer}" if self.group_peer is None else f"group_peer={self.group_peer}"
        return f"P2POp({self.op.__name__}, {self.tensor.dtype}{list(self.tensor.shape)}, {peer})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list:
    """Start every send and receive of the batch; returns their Works. Order between sends and receives does not
    matter (each peer has its own send and receive channels), order between two sends to one peer does."""
    if not isinstance(p2p_op_list, list) or not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError(f"batch_isend_irecv: expected a non-empty list of P2POp, got {p2p_op_list!r}")
    if any(p.group is not p2p_op_list[0].group for p in p2p_op_list):  # (None was taken as the default group)
        raise ValueError("batch_isend_irecv: all ops of a batch must use the same group")
    group = p2p_op_list[0].group
    if _rank_not_in_group(group, "batch_isend_irecv"):
        return []
    pg = _group(group)  # check every peer before the first op starts
    peers = [_peer(group, *p._named, "peer", default=None) for p in p2p_op_list]
    for p, peer in zip(p2p_op_list, peers):
        if peer == pg.rank():
            raise ValueError(f"batch_isend_irecv: {p!r} names this rank as its peer")
    return [pg.send(p.tensor, peer, p.tag) if p.op is isend else pg.recv(p.tensor, peer, p.tag)
            for p, peer in zip(p2p_op_list, peers)]
