"""What DeepSpeed's engines offer beyond the training step (``deepspeed/runtime/engine.py``), over the core's
:class:`ds_zero.engine.DeepSpeedEngine` and :class:`ds_zero.pipe.engine.PipelineEngine`: checkpoints in DeepSpeed's
layout, the attributes DeepSpeed's tests and users read, the wrapped module's attributes through the engine, and
torch-style ``output.backward(grad)`` on the engine's outputs."""

from __future__ import annotations

import time

import torch
import torch.utils._pytree as pytree

from ds_zero import engine
from ds_zero._compat import checkpoint
from ds_zero.pipe import engine as pipe_engine


class DeepSpeedEngineAPI:
    """DeepSpeed's engine methods that the training step itself does not need; both engines have them."""

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True) -> bool:
        return checkpoint.save_checkpoint(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True):
        """Returns ``(load_path, client_state)``, or ``(None, None)`` when there is no ``latest`` (as DeepSpeed)."""
        return checkpoint.load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states)

    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def steps_per_print(self) -> int | None:
        return self._config.steps_per_print

    def zero_optimization_stage(self) -> int:
        return self._config.zero.stage

    @property
    def config(self):
        return self._config

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def was_step_applied(self) -> bool:
        """Whether the last ``step()`` updated the parameters (False off a boundary or on an fp16 overflow)."""
        return self._step_applied

    def get_global_grad_norm(self):
        """The last step's gradient norm: a 0-dim tensor at ZeRO stages 1-3, a float at stage 0, inf after an
        overflow, None before the first step (DeepSpeed's types)."""
        return self.optimizer.get_global_grad_norm() if self._stepped else None

    def fp16_enabled(self) -> bool:
        return self._config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self._config.bf16_enabled

    def loss_scale(self) -> float:
        """The configured ``fp16.loss_scale`` (0 = dynamic), as DeepSpeed's; the current scale is
        ``engine.optimizer.loss_scale`` (or ``cur_scale``)."""
        return self._config.fp16.loss_scale

    @property
    def _global_grad_norm(self):
        return self.get_global_grad_norm()

    def __getattr__(self, name):
        """Attributes the engine does not have come from the wrapped module (DeepSpeed's ``__getattr__``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if "module" in modules:
                try:
                    return getattr(modules["module"], name)
                except AttributeError:
                    pass
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'") from None


class DeepSpeedEngine(DeepSpeedEngineAPI, engine.DeepSpeedEngine):
    """``output.backward(grad)`` without ``engine.backward``: hooks on the outputs scale the gradient as
    ``engine.backward`` scales the loss, and finish the micro-step after autograd is done."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._in_engine_backward = False
        self._torch_style_backward = False

    def forward(self, *inputs, **kwargs):
        out = super().forward(*inputs, **kwargs)
        if torch.is_grad_enabled():
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                    leaf.register_hook(self._output_grad_hook)
        return out

    def _output_grad_hook(self, grad):
        if self._in_engine_backward:
            return None
        if not self._torch_style_backward:
            self._torch_style_backward = True
            self.optimizer.backward_prologue(self.is_gradient_accumulation_boundary())

            def done():
                self._torch_style_backward = False
                self.optimizer.post_backward(self.is_gradient_accumulation_boundary())

            torch.autograd.Variable._execution_engine.queue_callback(done)
        return grad * (self.loss_scaler.loss_scale / self.gradient_accumulation_steps())

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        self._in_engine_backward = True
        try:
            return super().backward(loss, retain_graph, scale_wrt_gas)
        finally:
            self._in_engine_backward = False


class PipelineEngine(DeepSpeedEngineAPI, pipe_engine.PipelineEngine):
    """``train_batch`` also prints DeepSpeed's progress line every ``steps_per_print`` steps, as DeepSpeed prints it
    (scripts and log scrapers read it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._progress_t0 = None

    def train_batch(self, data_iter=None) -> torch.Tensor:
        if self._progress_t0 is None:
            self._progress_t0 = time.perf_counter()
        loss = super().train_batch(data_iter)
        every = self.steps_per_print()
        if every is not None and self.global_steps % every == 0:
            iter_time = (time.perf_counter() - self._progress_t0) / every
            self._progress_t0 = None
            if self.global_rank == 0:
                print(f"steps: {self.global_steps} loss: {loss:0.4f} iter time (s): {iter_time:0.3f} "
                      f"samples/sec: {self.train_batch_size() / iter_time:0.3f}", flush=True)
        return loss
