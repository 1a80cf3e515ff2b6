"""``RRef``: a reference to a value that lives on one worker (its owner), as ``torch.distributed.rpc.RRef``.

torch/csrc/distributed/rpc/rref_impl.h (``OwnerRRef``, ``UserRRef``) and torch/distributed/rpc/rref_proxy.py.
The owner's RRef holds the value in a ``torch.futures.Future`` (set when the ``remote`` call finishes); a
user's holds the owner, the RRef id and its own fork id. ``to_here`` fetches a copy, ``local_value`` is the
owner's, ``backward`` runs backward from it on the owner, and ``rref.rpc_sync().method(...)`` (``rpc_async``,
``remote``) runs ``method`` on the owner's value. An RRef is pickled only inside an RPC (serialize.py), where
rref_context.py does the fork protocol; a user's ``__del__`` tells the owner.
"""

from __future__ import annotations

import torch

from pt_dist.autograd import container, engine
from pt_dist.rpc.functions import async_execution
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

    def owner_name(self) -> str:
        return self.owner().name

    def confirmed_by_owner(self) -> bool:
        return self._confirmed

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

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """Backward from the value (a scalar tensor), run on the owner: local autograd without a context (owner
        only), else the distributed backward of context ``dist_autograd_ctx_id`` (torch's ``RRef.backward``)."""
        if self.is_owner():
            _backward_on_owner(self, dist_autograd_ctx_id, retain_graph)
        elif dist_autograd_ctx_id == -1:
            raise RuntimeError("User RRefs require 'dist_autograd_ctx_id' to be specified")
        else:
            self._call_owner(_backward_on_owner, (self, dist_autograd_ctx_id, retain_graph)).wait()

    def _call_owner(self, fn, args: tuple, timeout: float = UNSET_RPC_TIMEOUT):
        """``rpc_async(self.owner(), fn, args)``, in this thread's distributed-autograd context."""
        self._check_created()
        return self._agent.request(self._owner, ("call", fn, args, {}), timeout, container.current_context())

    def _get_future(self) -> torch.futures.Future:
        """The Future of the ``remote`` call that created this RRef (its value, on the owner)."""
        if self.is_owner():
            return self._value
        if self._creation is None:
            done = torch.futures.Future()
            done.set_result(None)
            return done
        return self._creation

    def rpc_sync(self, timeout: float = UNSET_RPC_TIMEOUT):
        return _Proxy(self, "sync", timeout)

    def rpc_async(self, timeout: float = UNSET_RPC_TIMEOUT):
        return _Proxy(self, "async", timeout)

    def remote(self, timeout: float = UNSET_RPC_TIMEOUT):
        return _Proxy(self, "remote", timeout)

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


def _backward_on_owner(rref: RRef, context_id: int, retain_graph: bool) -> None:
    value = rref.local_value()
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(f"RRef should contain a tensor for .backward(), but it holds {type(value).__name__}")
    if context_id == -1:
        torch.autograd.backward(value, retain_graph=retain_graph)
    else:
        engine.backward(context_id, [value], retain_graph=retain_graph)


@async_execution
def _invoke(rref: RRef, name: str, args, kwargs):
    """On the owner: ``getattr(value, name)(*args, **kwargs)``; an ``@async_execution`` method's Future as is."""
    method = getattr(rref.local_value(), name)
    out = method(*args, **kwargs)
    if getattr(method, "_wrapped_async_rpc_function", None) is not None:
        return out
    fut = torch.futures.Future()
    fut.set_result(out)
    return fut


class _Proxy:
    """``rref.rpc_sync()`` / ``rpc_async()`` / ``remote()``: attribute access names a method of the value."""

    def __init__(self, rref: RRef, mode: str, timeout: float):
        self._rref, self._mode, self._timeout = rref, mode, timeout

    def __getattr__(self, name: str):
        rref, mode, timeout = self._rref, self._mode, self._timeout

        def method(*args, **kwargs):
            if mode == "remote":
                rref._check_created()
                return rref._agent.rrefs.remote(rref._owner, _invoke, (rref, name, args, kwargs), {}, timeout,
                                                container.current_context())
            fut = rref._call_owner(_invoke, (rref, name, args, kwargs), timeout)
            return fut.wait() if mode == "sync" else fut

        method.__name__ = name
        return method
