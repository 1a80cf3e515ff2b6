"""What a worker does with each request: torch's ``RequestCallbackImpl`` (torch/csrc/distributed/rpc/).

Every request is ``(op, *arguments)``; the agent runs ``HANDLERS[op](agent, src, *arguments)`` on its pool and
answers with the return value, or, when it is a ``torch.futures.Future``, with what it completes to. ``call``
runs a user function (``PythonCall``), ``remote`` makes the owner's RRef and runs the function into it
(``PythonRemoteCall``), ``to_here`` answers with the value once ready (``PythonRRefFetchCall``); the rest are
the RRef protocol's messages and distributed autograd's.
"""

from __future__ import annotations

import traceback

import torch

from pt_dist.autograd import engine
from pt_dist.rpc import serialize


def is_async(fn) -> bool:
    """Marked by ``@rpc.functions.async_execution``: the attribute torch's decorator sets."""
    return getattr(fn, "_wrapped_async_rpc_function", None) is not None


def _checked(fn, out):
    """``out`` as the call's answer: a Future only from an ``@async_execution`` function, as torch's checks."""
    if is_async(fn):
        if not isinstance(out, torch._C.Future):
            raise RuntimeError(f"Functions decorated with @rpc.async_function must return a torch.futures.Future "
                               f"object, but got {type(out)} (from {fn.__name__})")
    elif isinstance(out, torch._C.Future):
        raise RuntimeError(f"Can not pickle torch.futures.Future (returned by {fn.__name__}): decorate the "
                           f"function with @rpc.functions.async_execution to answer with what it completes to")
    return out


def _call(agent, src, fn, args, kwargs):
    return _checked(fn, fn(*args, **(kwargs or {})))


def run_into(rref, fn, args, kwargs, where: str = "") -> None:
    """Run ``fn`` into the owner ``rref``'s value: its result, what its Future completes to, or its error
    (with the traceback of ``where``), so a ``to_here`` waiting on it always gets an answer."""
    try:
        out = _checked(fn, fn(*args, **(kwargs or {})))
    except Exception as e:
        rref._value.set_exception(serialize.rebuild_error(
            serialize.error_payload(e, where or str(rref._agent.info), traceback.format_exc())))
        return
    if is_async(fn):
        out.add_done_callback(lambda f: _settle(rref._value, f))
    else:
        rref._value.set_result(out)


def _remote(agent, src, fn, args, kwargs, rref_id, fork_id):
    rref = agent.rrefs.owner_rref(rref_id)
    agent.rrefs.add_fork(rref_id, fork_id)
    run_into(rref, fn, args, kwargs)
    return None


def _settle(target, fut) -> None:
    try:
        target.set_result(fut.wait())
    except Exception as e:
        target.set_exception(e)


def _to_here(agent, src, rref_id):
    return agent.rrefs.owner_rref(rref_id)._value


def _fork(agent, src, rref_id, fork_id):
    agent.rrefs.add_fork(rref_id, fork_id)


def _accept(agent, src, fork_id):
    agent.rrefs.accept(fork_id)


def _delete(agent, src, rref_id, fork_id):
    agent.rrefs.del_fork(rref_id, fork_id)


HANDLERS = {
    "call": _call, "remote": _remote, "to_here": _to_here, "rref_fork": _fork, "rref_accept": _accept,
    "rref_delete": _delete,
    "grad": lambda agent, src, *a: engine.on_grad(src, *a),
    "cleanup": lambda agent, src, *a: engine.on_cleanup(src, *a),
}


def install(agent) -> None:
    for op, fn in HANDLERS.items():
        agent.handlers[op] = (lambda f: lambda src, *a: f(agent, src, *a))(fn)
