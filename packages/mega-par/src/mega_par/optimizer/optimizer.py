"""Megatron's optimizer wrapper over a torch optimizer and the model-parallel gradient norm / clipping.

The global norm counts every parameter exactly once: TP-replicated parameters only on TP rank 0 and the
last stage's copy of a tied embedding not at all; the squared sum is all-reduced over the model-parallel
group (TP x PP) so every rank clips by the same factor an unsharded model would use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from mega_par import parallel_state as ps
from mega_par.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate


@dataclass
class OptimizerConfig:
    optimizer: str = "adam"  # "adam" (AdamW-style decoupled decay, as Megatron) or "sgd"
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    sgd_momentum: float = 0.0
    clip_grad: float = 0.0  # 0 disables clipping
    use_distributed_optimizer: bool = False

    def __post_init__(self):
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        if self.lr < 0 or self.clip_grad < 0:
            raise ValueError(f"lr and clip_grad must be >= 0, got lr={self.lr}, clip_grad={self.clip_grad}")


def default_no_weight_decay_cond(name: str, param) -> bool:
    """Megatron's default: no weight decay for biases and every 1-D parameter (norm weights)."""
    return name.endswith(".bias") or param.dim() == 1


def weight_decay_param_groups(config: OptimizerConfig, named_params, no_weight_decay_cond=None) -> list[dict]:
    """``[{params, weight_decay}]``: the decayed parameters, then those ``no_weight_decay_cond`` exempts."""
    cond = no_weight_decay_cond or default_no_weight_decay_cond
    decay, no_decay = [], []
    for name, p in named_params:
        (no_decay if cond(name, p) else decay).append(p)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_torch_optimizer(config: OptimizerConfig, param_groups):
    """The torch optimizer over ``param_groups`` (None when this rank has nothing to update)."""
    if not param_groups:
        return None
    if config.optimizer == "adam":
        return torch.optim.AdamW(param_groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                                 eps=config.adam_eps)
    return torch.optim.SGD(param_groups, lr=config.lr, momentum=config.sgd_momentum)


def param_is_not_shared(param) -> bool:
    """False for the last stage's copy of a tied embedding when the first stage holds the original."""
    if not getattr(param, "shared_embedding", False):
        return True
    return ps.is_pipeline_first_stage(ignore_virtual=True)


def get_grad_norm_fp32(grads_sq_sum: torch.Tensor, groups) -> float:
    total = grads_sq_sum.clone()
    for group in groups:
        if dist.get_world_size(group) > 1:
            dist.all_reduce(total, group=group)
    return float(total.sqrt())


def clip_coefficient(total_norm: float, max_norm: float) -> float | None:
    if max_norm <= 0:
        return None
    coeff = max_norm / (total_norm + 1e-6)
    return coeff if coeff < 1.0 else None


class MegatronOptimizer:
    """Non-sharded optimizer: steps ``torch.optim`` on the parameters using their ``main_grad`` buffers.

    ``no_weight_decay_cond(name, param)`` picks the parameters without weight decay (default: biases and
    1-D parameters, as Megatron's ``get_megatron_optimizer``).
    """

    def __init__(self, config: OptimizerConfig, model_chunks, no_weight_decay_cond=None):
        self.config, self.model_chunks = config, list(model_chunks)
        named = [(n, p) for m in self.model_chunks for n, p in m.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        self.optimizer = build_torch_optimizer(config, weight_decay_param_groups(config, named,
                                                                                  no_weight_decay_cond))

    def _grads(self):
        return [(p, p.main_grad if hasattr(p, "main_grad") else p.grad) for p in self.params]

    def get_grad_norm(self) -> float:
        sq = torch.zeros((), dtype=torch.float32, device=self.params[0].device if self.params else "cpu")
        for p, g in self._grads():
            if g is not None and param_is_not_tensor_parallel_duplicate(p) and param_is_not_shared(p):
                sq += g.float().pow(2).sum()
        return get_grad_norm_fp32(sq, [ps.get_model_parallel_group()])

    @torch.no_grad()
    def step(self):
        """Returns ``(update_successful, grad_norm, num_zeros_in_grad)`` like Megatron."""
        grad_norm = self.get_grad_norm()
        coeff = clip_coefficient(grad_norm, self.config.clip_grad)
        for p, g in self._grads():
            if g is not None:
                if coeff is not None:
                    g.mul_(coeff)
                p.grad = g if g.dtype == p.dtype else g.to(p.dtype)
        if self.optimizer is not None:
            self.optimizer.step()
        for p in self.params:
            p.grad = None
        return True, grad_norm, None

    # --- Megatron's MegatronOptimizer surface around the step ----------------------------------------------
    @property
    def param_groups(self) -> list:
        """The torch optimizer's groups (learning-rate schedulers set ``lr`` here)."""
        return self.optimizer.param_groups if self.optimizer is not None else []

    def get_parameters(self) -> list:
        return [p for g in self.param_groups for p in g["params"]]

    def get_loss_scale(self) -> torch.Tensor:
        """1.0: these optimizers step in fp32 without loss scaling (Megatron's ``FP32Optimizer``)."""
        return torch.ones(1, dtype=torch.float32)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.get_loss_scale().to(loss.device) * loss

    def get_main_grads_for_grad_norm(self) -> list:
        """The gradients the norm counts: each parameter once (not TP duplicates, not a tied copy)."""
        return [g for p, g in self._grads() if g is not None and param_is_not_tensor_parallel_duplicate(p)
                and param_is_not_shared(p)]

    @torch.no_grad()
    def clip_grad_norm(self, clip_grad: float) -> float:
        """Scale the gradients so their global norm is at most ``clip_grad``; returns the norm before."""
        norm = self.get_grad_norm()
        coeff = clip_coefficient(norm, clip_grad)
        if coeff is not None:
            for _, g in self._grads():
                if g is not None:
                    g.mul_(coeff)
        return norm

    def count_zeros(self) -> float:
        """Zero entries over the gradients the norm counts, summed over the model-parallel group."""
        n = torch.zeros((), dtype=torch.float32)
        for g in self.get_main_grads_for_grad_norm():
            n += g.numel() - torch.count_nonzero(g).item()
        if dist.get_world_size(ps.get_model_parallel_group()) > 1:
            dist.all_reduce(n, group=ps.get_model_parallel_group())
        return float(n)

    def reload_model_params(self) -> None:
        """Nothing to reload: this optimizer steps the model's own fp32 parameters."""

    def zero_grad(self) -> None:
        for m in self.model_chunks:
            if hasattr(m, "zero_grad_buffer"):
                m.zero_grad_buffer()
        for p in self.params:
            p.grad = None

    def state_dict(self):
        return self.optimizer.state_dict() if self.optimizer is not None else {}

    def load_state_dict(self, state_dict) -> None:
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state_dict)
