"""Distributed autograd, as ``torch.distributed.autograd``: ``context``, ``backward``, ``get_gradients``.

Read ``container.py`` (what a context holds), ``functions.py`` (the recv function recorded on every RPC that
carries tensors requiring grad), then ``engine.py`` (the FAST-mode backward that follows them across workers)
and ``capture.py`` (where a pass's leaf gradients go, their hooks run). ``backward`` checks its arguments as
torch's does first (pt_dist/_compat/autograd/backward.py).
"""

from pt_dist._compat.autograd.backward import backward
from pt_dist._compat.autograd.debug_info import _get_debug_info
from pt_dist.autograd import container
from pt_dist.autograd.container import DistAutogradContext, context, get_gradients

__all__ = ["DistAutogradContext", "_get_debug_info", "backward", "container", "context", "get_gradients"]
