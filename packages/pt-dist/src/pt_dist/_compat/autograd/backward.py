"""``torch.distributed.autograd.backward``'s argument checks, with torch's messages (pybind's signature error,
then the context id, then ``DistEngine::validateRootsAndRetrieveEdges``), before the core's backward
(pt_dist/autograd/engine.py)."""

from __future__ import annotations

import torch

from pt_dist.autograd import container, engine


def backward(context_id: int, roots: list[torch.Tensor], retain_graph: bool = False) -> None:
    """torch.distributed.autograd.backward: run backward from scalar ``roots`` across every worker involved."""
    if not isinstance(context_id, int) or not isinstance(roots, (list, tuple)) or \
            not all(isinstance(r, torch.Tensor) for r in roots):
        raise TypeError(f"backward(): incompatible function arguments: takes (context_id: int, roots: "
                        f"list[Tensor], retain_graph: bool = False), got ({type(context_id).__name__}, "
                        f"{type(roots).__name__})")
    container.retrieve(context_id)  # an unknown id is named before the roots' checks, as torch's DistEngine
    if not roots:
        raise RuntimeError("No tensors provided for gradient computation.")
    for i, r in enumerate(roots):
        if not r.requires_grad:
            raise RuntimeError(f"requires_grad not set on root {i}")
        if r.numel() != 1:
            raise RuntimeError(f"Tensor root {i} is not a scalar, all roots need to be scalar (size "
                               f"{list(r.shape)})")
        if r.grad_fn is None:
            raise RuntimeError(f"Tensor root {i} does not have a valid gradient function (it is a leaf)")
    engine.backward(context_id, roots, retain_graph)
