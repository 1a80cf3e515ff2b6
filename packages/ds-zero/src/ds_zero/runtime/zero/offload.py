"""ZeRO-Offload's host side (Ren et al., "ZeRO-Offload", 2021; the ``cpu_offload`` path of DeepSpeed's
``stage_1_and_2.py``).

:class:`HostMemory` allocates the tensors that live in host memory (the fp32 master partitions, their
fp32 gradients, Adam's moments, offloaded parameter partitions), pinned when a GPU exists and
``pin_memory`` is set, and keeps them by role so their bytes can be summed.

:class:`GradientOffloader` moves each reduced gradient slice into its fp32 host buffer while backward
goes on: on a GPU the device-to-host copy runs on a side stream into pinned staging memory; on a
CPU-only machine a worker thread does the conversion and accumulation (torch ops release the GIL,
so it overlaps the rest of autograd). ``synchronize()`` is the barrier before the step reads them.
"""

from __future__ import annotations

import queue
import threading

import torch

ROLES = ("parameters", "gradients", "optimizer_states")


class HostMemory:
    def __init__(self, pin_memory: bool = True):
        # Pinning needs a CUDA context; on a CPU-only machine host memory is all there is.
        self.pin = bool(pin_memory) and torch.cuda.is_available()
        self.tensors: dict[str, list[torch.Tensor]] = {r: [] for r in ROLES}

    def zeros(self, numel: int, dtype: torch.dtype, role: str) -> torch.Tensor:
        t = torch.zeros(numel, dtype=dtype, device="cpu", pin_memory=self.pin)
        self.tensors[role].append(t)
        return t

    def adopt(self, t: torch.Tensor, role: str) -> torch.Tensor:
        """Move ``t`` into host memory under ``role`` (a copy unless it is already a host tensor of ours)."""
        out = t.detach().to("cpu", copy=True)
        if self.pin:
            out = out.pin_memory()
        self.tensors[role].append(out)
        return out

    def holds(self, t: torch.Tensor) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(ptr == h.untyped_storage().data_ptr() for ts in self.tensors.values() for h in ts)


class GradientOffloader:
    """``submit(dst, src, accumulate)``: ``dst`` (fp32, host) ``+=`` or ``=`` ``src`` (device), asynchronously."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ds_zero-grad-offload", daemon=True)
        self._thread.start()

    def submit(self, dst: torch.Tensor, src: torch.Tensor, accumulate: bool) -> None:
        event = None
        if self.cuda and src.is_cuda:
            # Stage the low-precision slice in pinned memory off the compute stream; the worker waits on the event.
            self.stream.wait_stream(torch.cuda.current_stream(src.device))
            with torch.cuda.stream(self.stream):
                staged = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
                staged.copy_(src, non_blocking=True)
                src.record_stream(self.stream)
                event = torch.cuda.Event()
                event.record(self.stream)
            src = staged
        self._queue.put((dst, src, accumulate, event))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            dst, src, accumulate, event = item
            try:
                if event is not None:
                    event.synchronize()
                if accumulate:
                    dst.add_(src)
                else:
                    dst.copy_(src)
            except BaseException as e:  # surfaced on the training thread at synchronize()
                self._error = e
            finally:
                self._queue.task_done()

    def synchronize(self) -> None:
        self._queue.join()
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError("gradient offload to host memory failed") from err

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=10)
