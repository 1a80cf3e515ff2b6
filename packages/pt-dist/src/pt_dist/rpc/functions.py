"""``@async_execution``: a function that returns a Future is answered when that Future completes.

torch/distributed/rpc/functions.py. The callee's pool thread returns right after the function does; the
response goes out from whichever thread completes the Future (agent.py ``_respond_future``), so a chain of
RPCs can wait on each other without holding a thread each.
"""

from __future__ import annotations

import functools


def async_execution(fn):
    """Mark ``fn`` (which must return a ``torch.futures.Future``) for asynchronous execution on the callee."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    wrapper._wrapped_async_rpc_function = fn
    return wrapper


def is_async(fn) -> bool:
    return getattr(fn, "_wrapped_async_rpc_function", None) is not None
