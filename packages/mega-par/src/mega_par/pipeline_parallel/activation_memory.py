"""Activation memory a pipeline stage holds, measured by summing tensor bytes (not RSS).

``ActivationMemoryTracker`` counts what autograd saved for backward (``torch.autograd.graph.saved_tensors_hooks``)
plus the stage outputs still alive, each storage once; parameters and buffers are not activations and are
left out. 1F1B's point (Narayanan et al., arXiv 2104.04473 §2.2) is that stage ``r`` of ``p`` holds at most
``min(p - r, m)`` micro-batches in flight; the all-forward-all-backward schedule here (GPipe, Huang et al.,
arXiv 1811.06965) holds all ``m`` and is the baseline the bound is measured against.
"""

from __future__ import annotations

import weakref

import torch

from mega_par import parallel_state as ps
from mega_par.pipeline_parallel import p2p_communication as p2p
from mega_par.pipeline_parallel.schedules import (
    _as_list,
    _check,
    _deallocate,
    _finish,
    _no_sync,
    _tensor_shape,
    backward_step,
    deallocate_output_tensor,
    forward_step,
)


def _storage(t: torch.Tensor):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class _Saved:
    """What autograd keeps instead of a saved tensor; its lifetime is the saved tensor's."""

    __slots__ = ("tensor", "key", "tracker")

    def __init__(self, tensor, key, tracker):
        self.tensor, self.key, self.tracker = tensor, key, tracker

    def __del__(self):
        self.tracker._release(self.key)


class ActivationMemoryTracker:
    """``with tracker:`` around a schedule; ``forward_step_func=tracker.wrap(f)`` also tracks stage outputs.

    ``peak_bytes``: the most activation bytes alive at once, sampled whenever autograd saves a tensor and
    around every forward step; ``alive_bytes()``: now.
    """

    def __init__(self, model):
        chunks = _as_list(model)
        self._excluded = {_storage(t)[0] for m in chunks for t in (*m.parameters(), *m.buffers())}
        self._saved: dict[int, list] = {}  # storage pointer -> [bytes, number of saved tensors on it]
        self._saved_bytes = 0
        self._outputs: list[weakref.ref] = []
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    def _pack(self, t):
        key, nbytes = _storage(t)
        if key in self._excluded or nbytes == 0:
            return t
        entry = self._saved.setdefault(key, [nbytes, 0])
        if entry[1] == 0:
            self._saved_bytes += nbytes
        entry[1] += 1
        self.sample()
        return _Saved(t, key, self)

    @staticmethod
    def _unpack(x):
        return x.tensor if isinstance(x, _Saved) else x

    def _release(self, key) -> None:
        entry = self._saved.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self._saved_bytes -= entry[0]
            del self._saved[key]

    def outputs_bytes(self) -> int:
        """Bytes of the tracked stage outputs still alive whose storage no saved tensor already counts."""
        seen, total = set(self._saved), 0
        self._outputs = [r for r in self._outputs if r() is not None]
        for ref in self._outputs:
            key, nbytes = _storage(ref())
            if key not in seen:
                seen.add(key)
                total += nbytes
        return total

    def alive_bytes(self) -> int:
        return self._saved_bytes + self.outputs_bytes()

    def sample(self) -> int:
        now = self.alive_bytes()
        self.peak_bytes = max(self.peak_bytes, now)
        return now

    def wrap(self, forward_step_func):
        def tracked(data_iterator, model):
            self.sample()
            output, loss_func = forward_step_func(data_iterator, model)
            if torch.is_tensor(output):
                self._outputs.append(weakref.ref(output))
            self.sample()
            return output, loss_func

        return tracked


def forward_backward_pipelining_all_forward_all_backward(
    *,
    forward_step_func,
    data_iterator,
    model,
    num_microbatches: int,
    seq_length: int | None,
    micro_batch_size: int | None,
    forward_only: bool = False,
):
    """GPipe's schedule over Megatron's p2p: all ``m`` forwards, then all ``m`` backwards (memory baseline)."""
    _check(num_microbatches, seq_length, micro_batch_size)
    (model,), data_iterator = _as_list(model), _as_list(data_iterator)[0]
    shape, dealloc = _tensor_shape(model, seq_length, micro_batch_size), _deallocate(model)
    free_sent = dealloc and not ps.is_pipeline_last_stage()
    inputs, outputs, losses = [], [], []
    for _ in range(num_microbatches):
        input_tensor = p2p.recv_forward(shape)
        output_tensor = forward_step(
            forward_step_func, data_iterator, model, num_microbatches, input_tensor, losses, forward_only
        )
        p2p.send_forward(output_tensor, shape)
        if not forward_only:
            deallocate_output_tensor(output_tensor, free_sent)
            inputs.append(input_tensor)
            outputs.append(output_tensor)
    if not forward_only:
        with _no_sync(model):
            for _ in range(num_microbatches - 1):
                _backward_one(inputs, outputs, shape, dealloc)
        _backward_one(inputs, outputs, shape, dealloc)  # the last backward lets DDP launch its grad sync
    _finish([model], forward_only)
    return losses


def _backward_one(inputs, outputs, shape, dealloc) -> None:
    output_tensor_grad = p2p.recv_backward(shape)
    input_tensor_grad = backward_step(inputs.pop(0), outputs.pop(0), output_tensor_grad, dealloc)
    p2p.send_backward(input_tensor_grad, shape)
