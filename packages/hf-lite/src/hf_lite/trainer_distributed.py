"""How the Trainer runs on several processes: the ``DataParallelPlugin`` extension point (the part of accelerate's
``Accelerator`` that transformers' Trainer calls).

The Trainer only ever talks to its plugin: ``prepare`` wraps model and optimizer, ``no_sync`` / ``backward`` /
``clip_grad_norm_`` / ``optimizer_step`` / ``zero_grad`` run the step, ``unwrap_model`` / ``model_state_dict`` /
``optimizer_state_dict`` feed checkpoints, and ``all_reduce`` / ``broadcast_object`` / ``all_gather_object`` /
``barrier`` keep ranks in agreement (token counts, losses, metrics, early-stop and best-model decisions). The
public ``Trainer``'s default is torch's DDP (``_compat/torch_ddp.py``), a no-op on one process. Another data-parallel
engine plugs in by subclassing ``DataParallelPlugin`` and passing ``Trainer(..., parallelism=MyPlugin())``; hf-lite
never imports it."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn


class DataParallelPlugin:
    """One process, no wrapping: the behaviour every plugin overrides piece by piece.

    ``sharded_optimizer_state``: True when each rank holds a different optimizer state (ZeRO), so each rank writes
    ``rank{R}-of-{W}-optimizer.pt`` into checkpoints; otherwise the main process writes ``optimizer.pt``."""

    sharded_optimizer_state = False

    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    @property
    def process_index(self) -> int:
        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    # ------------------------------------------------------------------ the step
    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer, args):
        """Return ``(model_wrapped, optimizer)``; the Trainer steps its scheduler on the returned optimizer."""
        return model, optimizer

    def no_sync(self, model: nn.Module):
        """Context for micro-batches before the last of an accumulated step (no gradient communication)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        loss.backward()

    def clip_grad_norm_(self, model: nn.Module, max_norm: float) -> torch.Tensor | None:
        """Clip (``max_norm`` inf: only measure) and return the pre-clip global norm; None if the plugin clips
        inside ``optimizer_step`` (then ``get_global_grad_norm`` reports it)."""
        return torch.nn.utils.clip_grad_norm_(self.unwrap_model(model).parameters(), max_norm)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step; False when the step was skipped (then the scheduler does not step either)."""
        optimizer.step()
        return True

    def get_global_grad_norm(self) -> float | None:
        return None

    def zero_grad(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        model.zero_grad()

    # ------------------------------------------------------------------ checkpoints
    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, as the main process saves them."""
        return self.unwrap_model(model).state_dict()

    def optimizer_state_dict(self, optimizer) -> dict:
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state_dict: dict) -> None:
        optimizer.load_state_dict(state_dict)

    # ------------------------------------------------------------------ agreement between ranks
    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(tensor, op=op)
        return tensor

    def broadcast_object(self, obj, src: int = 0):
        if self.world_size <= 1:
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=src)
        return holder[0]

    def all_gather_object(self, obj) -> list:
        if self.world_size <= 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()
