"""``@rpc.functions.async_execution`` (torch/distributed/rpc/functions.py): marks a function that returns a
``torch.futures.Future``, so the callee answers with what that Future completes to.

The mark is the attribute torch's decorator sets; pt_dist/rpc/handlers.py reads it and agent.py answers from
the Future's callback, so a chain of RPCs can wait on each other without holding a thread each.
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
