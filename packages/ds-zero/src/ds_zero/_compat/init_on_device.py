"""``deepspeed.OnDevice`` (``deepspeed/utils/init_on_device.py``): build modules with their tensors on one device
(``meta`` for a model too large to materialise) and their floating-point tensors in one dtype, as DeepSpeed does by
redirecting the tensor constructors; here through torch's own device context and default dtype."""

from __future__ import annotations

import torch


class OnDevice:
    """``with OnDevice(dtype=torch.float16, device="meta"): model = MyModel()``; ``enabled=False`` changes
    nothing. Tensors given an explicit ``device`` keep it."""

    def __init__(self, dtype, device="meta", enabled: bool = True):
        if enabled and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"OnDevice: dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.dtype, self.device, self.enabled = dtype, device, enabled
        self._device_ctx, self._saved_dtype = None, None

    def __enter__(self):
        if not self.enabled:
            return None
        self._saved_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        self._device_ctx = torch.device(self.device)
        self._device_ctx.__enter__()
        return None

    def __exit__(self, exc_type, exc_value, traceback):
        if not self.enabled:
            return
        self._device_ctx.__exit__(exc_type, exc_value, traceback)
        torch.set_default_dtype(self._saved_dtype)
