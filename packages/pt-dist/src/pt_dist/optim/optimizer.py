"""``DistributedOptimizer``: one local optimizer per parameter owner, stepped with that context's gradients.

torch/distributed/optim/optimizer.py: the parameter RRefs are grouped by owner; each owner builds a
``_LocalOptimizer`` over its parameters (``rpc_async`` returning an RRef to it); ``step(context_id)`` asks every
owner, concurrently, to copy the gradients its distributed-autograd context accumulated into ``.grad`` and
step (under one lock per process, as torch's ``_LocalOptimizer.global_lock``: concurrent trainers take turns).
"""

from __future__ import annotations

import threading
from collections import defaultdict

from pt_dist.autograd import container
from pt_dist.rpc.rref import RRef
from pt_dist.rpc.worker import rpc_async


class _LocalOptimizer:
    global_lock = threading.Lock()

    def __init__(self, optim_cls, local_params_rref, *args, **kwargs):
        self._local_params = [rref.local_value() for rref in local_params_rref]
        self.optim = optim_cls(self._local_params, *args, **kwargs)

    def step(self, autograd_ctx_id: int) -> None:
        all_local_grads = container.get_gradients(autograd_ctx_id)
        with _LocalOptimizer.global_lock:
            for param, grad in all_local_grads.items():
                param.grad = grad
            self.optim.step()


def _new_local_optimizer(optim_cls, local_params_rref, *args, **kwargs):
    return RRef(_LocalOptimizer(optim_cls, local_params_rref, *args, **kwargs))


def _local_optimizer_step(local_optim_rref, autograd_ctx_id: int) -> None:
    local_optim_rref.local_value().step(autograd_ctx_id)


class DistributedOptimizer:
    """``DistributedOptimizer(optim.SGD, [param RRefs], lr=...)``; ``step(context_id)`` after
    ``pt_dist.autograd.backward``. Parameters without a gradient in the context are left as they are."""

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        per_worker = defaultdict(list)
        for param in params_rref:
            per_worker[param.owner()].append(param)
        futures = [rpc_async(worker, _new_local_optimizer, args=(optimizer_class, params, *args), kwargs=kwargs)
                   for worker, params in per_worker.items()]
        self.remote_optimizers = [f.wait() for f in futures]

    def step(self, context_id: int) -> None:
        container.retrieve(context_id)  # a valid context here, as torch's _is_valid_context
        futures = [rpc_async(opt.owner(), _local_optimizer_step, args=(opt, context_id))
                   for opt in self.remote_optimizers]
        errors = []
        for f in futures:
            try:
                f.wait()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]
