"""Distributed autograd, as ``torch.distributed.autograd``: ``context``, ``backward``, ``get_gradients``.

Read ``container.py`` (what a context holds), ``functions.py`` (the recv function recorded on every RPC that
carries tensors requiring grad), then ``engine.py`` (the FAST-mode backward that follows them across workers)
and ``capture.py`` (where a pass's leaf gradients go, their hooks run).
"""

from pt_dist.autograd import container
from pt_dist.autograd.container import DistAutogradContext, context, get_gradients
from pt_dist.autograd.engine import backward

__all__ = ["DistAutogradContext", "container", "backward", "context", "get_gradients"]
