"""A message's Python part as pickle with every tensor and RRef taken out: torch's ``_InternalRPCPickler``.

torch/distributed/rpc/internal.py pickles the call with a ``persistent_id`` hook so tensors travel beside the
pickle, never inside it; RRefs are turned into fork descriptors (rref_context.py). The tensors' bytes go out
as raw bytes with dtype/shape headers (pt_dist/_infra/rpc_transport.py). Inside a distributed-autograd
context, tensors that require grad record a send function on the way out and get a recv function on the way in
(pt_dist/autograd/functions.py). An exception is sent as its type and the remote traceback's text and raised
at the caller as that type (torch's ``RemoteException``: "On WorkerInfo(...):" then the traceback).
"""

from __future__ import annotations

import io
import pickle

import torch

from pt_dist._infra.rpc_transport import Message
from pt_dist.autograd.functions import attach_recv
from pt_dist.rpc.rref import RRef


class _Pickler(pickle.Pickler):
    def __init__(self, file, dst: int, agent):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.dst, self.agent, self.tensors, self._index = dst, agent, [], {}

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            i = self._index.get(id(obj))
            if i is None:
                i = self._index[id(obj)] = len(self.tensors)
                self.tensors.append(obj)
            return ("P" if isinstance(obj, torch.nn.Parameter) else "T", i)
        if isinstance(obj, RRef):
            return ("R", *self.agent.rrefs.fork(obj, self.dst))
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors, src: int, agent, waits: list | None):
        super().__init__(file)
        self.tensors, self.src, self.agent, self.waits = tensors, src, agent, waits

    def persistent_load(self, pid):
        kind = pid[0]
        if kind == "T":
            return self.tensors[pid[1]]
        if kind == "P":
            t = self.tensors[pid[1]]
            return t if t.grad_fn is not None else torch.nn.Parameter(t, requires_grad=t.requires_grad)
        if kind == "R":
            return self.agent.rrefs.unfork(self.src, *pid[1:], waits=self.waits)
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def encode(obj, dst: int, agent, ctx=None, kind: int = 0, rid: int = 0, flags: int = 0) -> Message:
    """``obj`` as a message to worker ``dst``; with a distributed-autograd ``ctx``, record a send function."""
    buf = io.BytesIO()
    pickler = _Pickler(buf, dst, agent)
    pickler.dump(obj)
    tensors = pickler.tensors
    msg = Message(kind, rid, buf.getvalue(), tensors, flags)
    if ctx is not None:
        msg.ctx_id = ctx.context_id
        msg.grad_mask = [t.requires_grad for t in tensors]
        if any(msg.grad_mask):
            msg.ag_msg = ctx.record_send([t for t, rg in zip(tensors, msg.grad_mask) if rg], dst)
        else:
            msg.grad_mask = []
            ctx.add_known_worker(dst)
    return msg


def decode(msg: Message, src: int, agent, waits: list | None = None):
    """The object ``msg`` carries from worker ``src``; tensors that required grad get a recv function first.
    ``waits`` collects a Future per user RRef in it that its owner has yet to confirm (see agent._serve)."""
    tensors = msg.tensors
    if msg.ag_msg >= 0 and any(msg.grad_mask):
        tensors = attach_recv(msg.ctx_id, src, msg.ag_msg, tensors, msg.grad_mask)
    return _Unpickler(io.BytesIO(msg.meta), tensors, src, agent, waits).load()


def error_payload(exc: BaseException, where: str, tb_text: str) -> tuple:
    """What travels for a remote exception: its type when the caller can unpickle it, and the traceback text."""
    kind = type(exc)
    try:
        pickle.loads(pickle.dumps(kind))
    except Exception:
        kind = None
    return (kind, f"On {where}:\n{tb_text}")


def rebuild_error(payload) -> BaseException:
    """The caller's copy of a remote exception: the same type where it takes one message argument."""
    kind, text = payload
    if isinstance(kind, type) and issubclass(kind, BaseException):
        try:
            return kind(text)
        except Exception:
            pass
    return RuntimeError(text)
