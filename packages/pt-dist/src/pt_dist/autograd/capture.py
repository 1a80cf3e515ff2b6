"""A pass's leaves: gradients into the context, the leaves' AccumulateGrad hooks run, ``.grad`` untouched.

torch's ``DistAccumulateGradCaptureHook`` (torch/csrc/distributed/autograd/engine/dist_engine.cpp): at each
leaf's ``AccumulateGrad`` the engine runs the node's pre hooks, accumulates their result into the context
instead of ``.grad``, then runs the node's post hooks (a DDP reducer's, say); the tensor's
post-accumulate-grad hooks do not run. Python cannot read a node's hooks, so the engine runs the node itself:
for the pass we add a pre hook after the user's that takes the gradient into the context and hands the node
None, so nothing reaches ``.grad`` (the post hooks then see None as the gradient: read it with
``get_gradients``). A leaf's post-accumulate-grad hooks are wrapped to skip passes on this thread only. The
engine runs a CPU graph on the thread that called it, so "this pass" is a thread-local mark.
"""

from __future__ import annotations

import threading

import torch

_current = threading.local()  # .capture: the LeafCapture of the pass running on this thread


class _SkipInDistributedPass:
    """A post-accumulate-grad hook that does not run inside a distributed pass (torch's engine never calls it)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, tensor):
        if getattr(_current, "capture", None) is None:
            return self.fn(tensor)
        return None


def _quiet_post_accumulate_hooks(leaf: torch.Tensor) -> None:
    hooks = getattr(leaf, "_post_accumulate_grad_hooks", None)
    for key, fn in list((hooks or {}).items()):
        if not isinstance(fn, _SkipInDistributedPass):
            hooks[key] = _SkipInDistributedPass(fn)


class LeafCapture:
    """``with LeafCapture(ctx, leaves, nodes, skip):`` around one engine call: each leaf's gradient (after its
    node's pre hooks) is accumulated in ``ctx``, except the leaves whose id is in ``skip`` (recv anchors)."""

    def __init__(self, ctx, leaves: list[torch.Tensor], nodes: list, skip):
        self.ctx, self.leaves, self.nodes, self.skip = ctx, leaves, nodes, skip
        self._handles: list = []

    def _sink(self, leaf: torch.Tensor):
        def hook(grads):
            if getattr(_current, "capture", None) is not self:
                return None  # another thread's pass through the same leaf: its own hook takes it
            if grads[0] is not None and id(leaf) not in self.skip:
                self.ctx.accumulate(leaf, grads[0])
            return (None,)

        return hook

    def __enter__(self) -> LeafCapture:
        for leaf, node in zip(self.leaves, self.nodes):
            _quiet_post_accumulate_hooks(leaf)
            self._handles.append(node.register_prehook(self._sink(leaf)))
        self._outer = getattr(_current, "capture", None)
        _current.capture = self
        return self

    def __exit__(self, *exc) -> None:
        _current.capture = self._outer
        for h in self._handles:
            h.remove()
