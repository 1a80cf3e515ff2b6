"""torch's ``RRef`` surface over the core RRef (pt_dist/rpc/rref.py): the ``rpc_sync()`` / ``rpc_async()`` /
``remote()`` proxies (torch/distributed/rpc/rref_proxy.py), ``backward`` (torch's ``PyRRef::backward``),
``owner_name``, ``confirmed_by_owner`` and ``_get_future``.

This subclass is ``pt_dist.rpc.RRef``, and ``pt_dist.rpc.init_rpc`` (init_rpc.py) makes it the class the RRef
context creates, so every RRef a user holds has these.
"""

from __future__ import annotations

import torch

from pt_dist._compat.autograd.backward import backward
from pt_dist._compat.rpc.functions import async_execution
from pt_dist.rpc import rref, worker
from pt_dist.rpc.options import UNSET_RPC_TIMEOUT


class RRef(rref.RRef):
    def owner_name(self) -> str:
        return self.owner().name

    def confirmed_by_owner(self) -> bool:
        return self._confirmed

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """Backward from the value (a scalar tensor), run on the owner: local autograd without a context (owner
        only), else the distributed backward of context ``dist_autograd_ctx_id`` (torch's ``RRef.backward``)."""
        if self.is_owner():
            _backward_on_owner(self, dist_autograd_ctx_id, retain_graph)
        elif dist_autograd_ctx_id == -1:
            raise RuntimeError("User RRefs require 'dist_autograd_ctx_id' to be specified")
        else:
            self._check_created()
            worker.rpc_sync(self.owner(), _backward_on_owner, args=(self, dist_autograd_ctx_id, retain_graph))

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
        return RRefProxy(self, worker.rpc_sync, timeout)

    def rpc_async(self, timeout: float = UNSET_RPC_TIMEOUT):
        return RRefProxy(self, worker.rpc_async, timeout)

    def remote(self, timeout: float = UNSET_RPC_TIMEOUT):
        return RRefProxy(self, worker.remote, timeout)


def _backward_on_owner(rref: RRef, context_id: int, retain_graph: bool) -> None:
    value = rref.local_value()
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(f"RRef should contain a tensor for .backward(), but it holds {type(value).__name__}")
    if context_id == -1:
        torch.autograd.backward(value, retain_graph=retain_graph)
    else:
        backward(context_id, [value], retain_graph=retain_graph)


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


class RRefProxy:
    """``rref.rpc_sync()`` / ``rpc_async()`` / ``remote()``: attribute access names a method of the value, run
    on the owner with ``rpc_api`` (torch's ``RRefProxy``)."""

    def __init__(self, rref: RRef, rpc_api, timeout: float):
        self.rref, self.rpc_api, self.rpc_timeout = rref, rpc_api, timeout

    def __getattr__(self, name: str):
        rref, rpc_api, timeout = self.rref, self.rpc_api, self.rpc_timeout

        def method(*args, **kwargs):
            rref._check_created()
            return rpc_api(rref.owner(), _invoke, args=(rref, name, args, kwargs), timeout=timeout)

        method.__name__ = name
        return method
