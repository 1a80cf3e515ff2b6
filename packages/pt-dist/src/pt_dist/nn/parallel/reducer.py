"""DDP's ``Reducer``: gradients into flat buckets as autograd produces them, one async all-reduce per full bucket.

torch's Reducer (torch/csrc/distributed/c10d/reducer.cpp), the same steps in the same order:

1. ``prepare_for_backward`` (after each forward that will sync): reset the per-iteration counts; with
   ``find_unused_parameters``, walk the autograd graph from the outputs and note the parameters it never
   reaches (marked ready at the first gradient, so their buckets still complete).
2. ``_autograd_hook`` (a post-accumulate-grad hook per parameter): ``_mark_variable_ready`` copies the
   gradient, divided by the world size, into its bucket's view; a bucket whose last gradient arrives is
   all-reduced at once (in bucket order, so every rank issues the same sequence) while backward goes on.
3. ``_end_of_backward`` (an engine callback queued from the outputs' gradient hook, so it runs once the whole
   backward is over): wait for every bucket and write the averaged gradients back.

The first iteration records the order gradients became ready; the next forward rebuilds the buckets in that
order (rank 0's, broadcast, so every rank agrees). A parameter that got no gradient without
``find_unused_parameters`` fails the backward with its name on that rank, after the rank has still sent its
buckets (zeros) so peers that did get every gradient are not left waiting. ``static_graph``: the first
iteration reduces everything at its end and counts each parameter's hooks; later iterations know the unused
parameters and how many hook calls make a gradient whole (a layer checkpointed twice).
"""

from __future__ import annotations

import logging
import weakref

import torch

from pt_dist.nn.parallel.bucketing import (
    _DEFAULT_FIRST_BUCKET_BYTES,
    Bucket,
    GradBucket,
    _compute_bucket_assignment_by_size,
    bucket_allocator,
)

log = logging.getLogger(__name__)


class Reducer:
    """Buckets, hooks and the iteration state; ``DistributedDataParallel`` drives it (torch's ``dist.Reducer``)."""

    def __init__(self, params, bucket_indices, per_bucket_size_limits, process_group, expect_sparse_gradients=None,
                 bucket_bytes_cap: int = 25 * 1024 * 1024, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, param_to_name_mapping=None,
                 first_bucket_bytes_cap: int = _DEFAULT_FIRST_BUCKET_BYTES):
        self._params = list(params)
        if any(expect_sparse_gradients or []):
            raise NotImplementedError("Reducer: sparse gradients are not supported; use dense embeddings")
        self._group, self._world = process_group, process_group.size()
        self._names = dict(param_to_name_mapping or {})
        self.find_unused_parameters, self.gradient_as_bucket_view = find_unused_parameters, gradient_as_bucket_view
        self._caps = [first_bucket_bytes_cap, bucket_bytes_cap]
        self.static_graph = False
        self._comm_hook = None  # (state, hook)
        n = len(self._params)
        self._local_used = torch.zeros(n, dtype=torch.int32)  # set by hooks, kept across no_sync iterations
        self._global_unused: set[int] = set()  # static graph: parameters no rank used in its first iteration
        self._expected_hooks: list[int] | None = None  # static graph: hook calls per parameter, once known
        self._rebuilt_order: list[int] = []
        self._has_rebuilt, self._order_complete = False, False
        self._expect_hooks = False
        self._zeros = bucket_allocator(process_group, self._params)
        self._init_buckets(bucket_indices, per_bucket_size_limits)
        self._reset_iteration([])
        me = weakref.ref(self)  # the parameters' hooks must not keep a dropped DDP's reducer alive

        def hook(i):
            def on_grad(param):
                reducer = me()
                if reducer is not None:
                    reducer._autograd_hook(i)
            return on_grad
        self._handles = [p.register_post_accumulate_grad_hook(hook(i)) for i, p in enumerate(self._params)]

    # -- buckets -----------------------------------------------------------------------------------------------

    def _init_buckets(self, bucket_indices, per_bucket_size_limits) -> None:
        flat = sorted(i for b in bucket_indices for i in b)
        if flat != list(range(len(self._params))):
            raise ValueError(f"Reducer: bucket_indices must name every parameter once, got {bucket_indices}")
        self._buckets = [Bucket(b, [self._params[i] for i in idx], list(idx), limit, self._zeros)
                         for b, (idx, limit) in enumerate(zip(bucket_indices, per_bucket_size_limits))]
        self._locator = {}
        for bucket in self._buckets:
            for k, i in enumerate(bucket.param_indices):
                self._locator[i] = (bucket, k)
                grad = self._params[i].grad
                if self.gradient_as_bucket_view and grad is not None:  # existing gradients move into the buffer
                    bucket.views[k].copy_(grad)
                    self._params[i].grad = bucket.views[k]

    def _should_rebuild(self) -> bool:
        return (self.static_graph or not self.find_unused_parameters) and not self._has_rebuilt

    def _rebuild_buckets(self) -> bool:
        """Called by DDP before a forward: once the first iteration has recorded the ready order, rebucket by rank
        0's order (broadcast) with the same size limits; True if it did."""
        if not self._should_rebuild() or not self._order_complete:
            return False
        seen = set(self._rebuilt_order)
        order = self._rebuilt_order + [i for i in reversed(range(len(self._params))) if i not in seen]
        agreed = torch.tensor(order, dtype=torch.int64)
        self._group.broadcast(agreed, 0).wait()
        order = agreed.tolist()
        indices, limits = _compute_bucket_assignment_by_size([self._params[i] for i in order], self._caps,
                                                             tensor_indices=order)
        self._init_buckets(indices, limits)
        self._has_rebuilt = True
        log.info("DDP buckets rebuilt in gradient-ready order: %s", indices)
        return True

    def _get_bucket_indices(self) -> list[list[int]]:
        return [list(b.param_indices) for b in self._buckets]

    # -- one iteration -----------------------------------------------------------------------------------------

    def _reset_iteration(self, unused: list[int]) -> None:
        self._ready = [False] * len(self._params)
        self._hook_calls = [0] * len(self._params)
        for bucket in self._buckets:
            bucket.pending, bucket.future = len(bucket.param_indices), None
        self._next_bucket, self._unused, self._marked_unused = 0, unused, False
        self._end_queued, self._used_work = False, None

    def prepare_for_forward(self) -> None:
        """torch's: only statistics there; the previous iteration was checked at the end of its backward."""

    def prepare_for_backward(self, outputs) -> None:
        if self._expect_hooks and torch._C._current_graph_task_id() != -1:
            return  # a non-reentrant checkpoint re-running the forward inside this iteration's backward
        outputs = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
        unused = []
        if self.static_graph and self._expected_hooks is not None:
            unused = [i for i, calls in enumerate(self._expected_hooks) if calls == 0]
        elif self.find_unused_parameters and not self.static_graph:
            reached = _reached_leaves(outputs)
            unused = [i for i, p in enumerate(self._params) if id(p) not in reached]
        self._reset_iteration(unused)
        self._expect_hooks = True

    def _autograd_hook(self, i: int) -> None:
        p = self._params[i]
        if (self.find_unused_parameters or self._static_first_iteration()) and p.grad is not None:
            self._local_used[i] = 1  # (also under no_sync: used once in the accumulation counts as used)
        if not self._expect_hooks:
            return  # no_sync, or a backward DDP's forward did not prepare for
        if not self._marked_unused:
            self._marked_unused = True
            for j in self._unused:
                self._mark_variable_ready(j)
        self._hook_calls[i] += 1
        if self._should_rebuild() and self._hook_calls[i] == 1:
            self._rebuilt_order.append(i)
        if self.static_graph:
            if self._expected_hooks is None or self._hook_calls[i] < self._expected_hooks[i]:
                return  # first iteration: all reduced at its end; else a later call brings the whole gradient
        self._mark_variable_ready(i)

    def _mark_variable_ready(self, i: int) -> None:
        if self._ready[i]:
            raise RuntimeError(
                f"Expected to mark a variable ready only once. Parameter {self._name(i)!r} (index {i}) got its "
                f"gradient twice in one iteration: it is used in several reentrant backward passes (a layer "
                f"checkpointed twice with use_reentrant=True), or outside forward. Pass static_graph=True if the "
                f"set of used parameters does not change between iterations, or use use_reentrant=False")
        self._ready[i] = True
        bucket, k = self._locator[i]
        self._copy_grad_into(i, bucket.views[k])
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready_buckets()

    def _copy_grad_into(self, i: int, view: torch.Tensor) -> None:
        """The gradient into its bucket slot, divided by the world size unless a comm hook does its own averaging
        (torch multiplies by 1/world while copying: one pass)."""
        p, average = self._params[i], self._comm_hook is None
        grad = p.grad
        with torch.no_grad():
            if grad is None:
                view.zero_()
            elif grad.data_ptr() == view.data_ptr() and view.numel():  # already the bucket's view
                if average:
                    view.mul_(1.0 / self._world)
            else:
                torch.mul(grad, 1.0 / self._world, out=view) if average else view.copy_(grad)
                if self.gradient_as_bucket_view:
                    p.grad = view

    def _launch_ready_buckets(self) -> None:
        while self._next_bucket < len(self._buckets) and self._buckets[self._next_bucket].pending == 0:
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1
        if self._next_bucket == len(self._buckets):
            if self.find_unused_parameters or self._static_first_iteration():
                self._used_work = self._group.all_reduce(self._local_used, async_op=True)
            if not self._end_queued:  # (no output hook ran: this graph task's end is the iteration's end)
                self._queue_end_of_backward()

    def _launch(self, bucket: Bucket) -> None:
        if self._comm_hook is None:
            bucket.future = self._group.all_reduce(bucket.buffer, async_op=True).get_future()
            return
        state, hook = self._comm_hook
        future = hook(state, GradBucket(bucket, is_last=bucket.index == len(self._buckets) - 1))
        if not isinstance(future, torch._C.Future):
            raise RuntimeError(f"callback must return a torch.futures.Future object, but got {type(future)}")
        bucket.future = future

    def _watch_outputs(self, outputs) -> None:
        """A gradient hook on each output: the first to fire queues the end-of-iteration callback on the outermost
        backward (a parameter hook could fire inside a reentrant checkpoint's inner backward, which ends first)."""
        for t in outputs:
            if t.requires_grad:
                t.register_hook(self._on_output_grad)

    def _on_output_grad(self, grad):
        if self._expect_hooks and not self._end_queued:
            self._queue_end_of_backward()

    def _queue_end_of_backward(self) -> None:
        self._end_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        if not self._expect_hooks:
            return
        if self.static_graph and self._expected_hooks is None:
            self._end_queued = True
            self._marked_unused = True
            for i in range(len(self._params)):  # the first static iteration reduces it all now
                if not self._ready[i]:
                    self._mark_variable_ready(i)
        missing = [i for i, ready in enumerate(self._ready) if not ready]
        if missing:
            for i in missing:  # peers that got every gradient are waiting for these buckets: send zeros for them
                self._ready[i] = True
                bucket, k = self._locator[i]
                bucket.views[k].zero_()
                bucket.pending -= 1
            self._launch_ready_buckets()
            for bucket in self._buckets:
                bucket.future.wait()
            if self._used_work is not None:
                self._used_work.wait()
            self._expect_hooks = False
            self._order_complete = True  # peers that finished rebuild before the next forward: so does this rank
            raise RuntimeError(self._unused_message(missing))
        self._finalize_backward()

    def _finalize_backward(self) -> None:
        for bucket in self._buckets:
            result = bucket.future.wait()
            result = result[0] if isinstance(result, (list, tuple)) and len(result) == 1 else result
            if not isinstance(result, torch.Tensor) or result.numel() != bucket.buffer.numel():
                raise RuntimeError(f"comm hook: the future of bucket {bucket.index} must hold a tensor of "
                                   f"{bucket.buffer.numel()} elements (or a list of one), got {type(result)}")
            if result.data_ptr() != bucket.buffer.data_ptr():
                bucket.buffer.copy_(result)
        if self._used_work is not None:
            self._used_work.wait()
            if self._static_first_iteration():
                self._global_unused = {i for i, u in enumerate(self._local_used.tolist()) if u == 0}
        unused = self._global_unused if self.static_graph else (
            {i for i, u in enumerate(self._local_used.tolist()) if u == 0} if self.find_unused_parameters else set())
        with torch.no_grad():
            for bucket in self._buckets:
                for k, i in enumerate(bucket.param_indices):
                    if i not in unused:  # a parameter no rank used keeps its .grad untouched (None), as torch's
                        self._write_back(self._params[i], bucket.views[k])
        if self.static_graph and self._expected_hooks is None:
            self._expected_hooks = list(self._hook_calls)
        self._local_used.zero_()
        self._expect_hooks = False
        self._order_complete = True

    def _write_back(self, p: torch.Tensor, view: torch.Tensor) -> None:
        grad = p.grad
        if self.gradient_as_bucket_view:
            if grad is None or grad.data_ptr() != view.data_ptr():
                p.grad = view
        elif grad is None:
            p.grad = view.clone()
        else:
            grad.copy_(view)

    def _static_first_iteration(self) -> bool:
        return self.static_graph and self._expected_hooks is None

    # -- configuration -----------------------------------------------------------------------------------------

    def _set_static_graph(self) -> None:
        self.static_graph = True

    def register_comm_hook(self, state, hook) -> None:
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self._comm_hook = (state, hook)

    def _name(self, i: int) -> str:
        return self._names.get(i, f"parameters[{i}]")

    def _unused_message(self, missing: list[int]) -> str:
        names = ", ".join(self._name(i) for i in missing)
        if self.find_unused_parameters:
            return (f"DistributedDataParallel: on rank {self._group.rank()} the parameters {names} are reached from "
                    f"the forward outputs but got no gradient in this backward; make every output tensor take part "
                    f"in the loss (or detach the others)")
        return (f"Expected to have finished reduction in this iteration, but on rank {self._group.rank()} these "
                f"parameters were not used in producing the loss and got no gradient: {names}. Pass "
                f"find_unused_parameters=True to DistributedDataParallel, or make sure all forward outputs take part "
                f"in the loss")


def _reached_leaves(outputs) -> set[int]:
    """Ids of the leaf tensors the autograd graph reaches from ``outputs`` (prepare_for_backward's search)."""
    reached, seen = set(), set()
    stack = []
    for t in outputs:
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            reached.add(id(t))  # an output that is a parameter itself
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if variable is not None:
            reached.add(id(variable))
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)
    return reached
