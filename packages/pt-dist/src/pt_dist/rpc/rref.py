"""``RRef``: a reference to a value that lives on one worker (its owner), as ``torch.distributed.rpc.RRef``.

torch/csrc/distributed/rpc/rref_impl.h (``OwnerRRef``, ``UserRRef``). The owner's RRef holds the value in a
``torch.futures.Future`` (set when the ``remote`` call finishes); a user's holds the owner, the RRef id and its
own fork id. ``to_here`` fetches a copy, ``local_value`` is the owner's. An RRef is pickled only inside an RPC
(serialize.py), where rref_context.py does the fork protocol; a user's ``__del__`` tells the owner. torch's
conveniences on top (``rref.rpc_sync().method(...)`` proxies, ``backward``, ``owner_name``, ...) are the
subclass ``pt_dist.rpc.RRef`` in pt_dist/_compat/rpc/rref.py, the class the RRef context makes.
"""

from __future__ import annotations

import torch

from pt_dist.autograd import container
from pt_dist.rpc.options import UNSET_RPC_TIMEOUT
from pt_dist.rpc.rpc_agent import get_current_rpc_agent


class RRef:
    """``RRef(value)`` makes an owner RRef here; ``rpc.remote`` returns user RRefs to remote values."""

    def __init__(self, value=None, type_hint=None):
        agent = get_current_rpc_agent()
        self._init(agent, agent.rank, agent.rrefs.new_id(), None)
        self._value.set_result(value)

    @classmethod
    def _make(cls, agent, owner: int, rref_id: tuple, fork_id):
        r = cls.__new__(cls)
        r._init(agent, owner, rref_id, fork_id)
        return r

    def _init(self, agent, owner, rref_id, fork_id):
        self._agent, self._owner, self._rref_id, self._fork_id = agent, owner, rref_id, fork_id
        self._value = torch.futures.Future() if owner == agent.rank else None
        self._creation = None  # the remote() call's Future (users made by remote)
        self._confirmed = owner == agent.rank
        self._timed_out = False  # the remote() call that creates it timed out (torch's UserRRef::getTimedOut)
        self._deleted = False

    def is_owner(self) -> bool:
        return self._owner == self._agent.rank

    def owner(self):
        return self._agent.workers[self._owner]

    def local_value(self):
        """The value, on the owner only (waits for the ``remote`` call that makes it to finish)."""
        if not self.is_owner():
            raise RuntimeError(f"Cannot call localValue() on a non-local reference. Call it on {self.owner()}")
        return self._value.wait()

    def to_here(self, timeout: float = UNSET_RPC_TIMEOUT):
        """A copy of the value, fetched from the owner (blocking, within ``timeout`` seconds)."""
        if self.is_owner():
            return self.local_value()
        self._check_created()
        # inside a distributed-autograd context the fetch carries it, so the owner records a send for the value
        # and it arrives behind a recv function (torch's toHere: sendMessageWithAutograd, forced recording)
        value = self._agent.request(self._owner, ("to_here", self._rref_id), timeout,
                                    container.current_context()).wait()
        if not self._confirmed and self._fork_id == self._rref_id:  # made by remote(): the owner registers it
            # before computing the value, so an answer means we are known there
            self._agent.rrefs.confirm_pending(self._fork_id)
        return value

    def _check_created(self) -> None:
        if self._timed_out:
            raise RuntimeError(f"RRef creation via rpc.remote() to {self.owner()} timed out, and it is possible "
                               f"that the RRef on the owner node does not exist.")

    def __reduce__(self):
        raise RuntimeError("RRef is only picklable inside an RPC call (pt_dist.rpc), not with plain pickle")

    def __repr__(self) -> str:
        kind = "OwnerRRef" if self.is_owner() else "UserRRef"
        return f"{kind}(RRefId = {self._rref_id}, ForkId = {self._fork_id}, owner = {self._owner})"

    def __del__(self):
        try:
            if not self.is_owner() and self._confirmed and not self._deleted:
                self._deleted = True
                self._agent.rrefs.user_deleted(self._owner, self._rref_id, self._fork_id)
        except Exception:
            pass  # interpreter teardown
