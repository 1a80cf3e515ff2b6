"""``DeepSpeedEngine``: the training loop wrapper ``deepspeed.initialize`` returns (``deepspeed/runtime/engine.py``).

It owns the module (cast to fp16/bf16 when enabled), the ZeRO optimizer of the configured stage wrapped around
the torch optimizer it is given, the loss scaler, the lr schedule and the micro-step counter that decides
gradient-accumulation boundaries. ``backward(loss)`` divides the loss by the accumulation steps
(``scale_wrt_gas``) and multiplies it by the loss scale; ``step`` only updates on a boundary and never steps the
schedule on a skipped fp16 step. With an ``mpu`` the data-parallel group is the mpu's, and the gradient norm and
overflow checks also span its model-parallel group. ``ds_zero.initialize`` (:mod:`ds_zero._compat.initialize`)
reads DeepSpeed's arguments and config into what this constructor takes.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from ds_zero import memory
from ds_zero.runtime.activation_checkpointing import checkpointing
from ds_zero.runtime.config import DeepSpeedConfig
from ds_zero.runtime.fp16.loss_scaler import create_loss_scaler
from ds_zero.runtime.swap_tensor.zero_infinity import ZeroInfinity, check_nvme_space
from ds_zero.runtime.zero.partition_parameters import is_zero_param
from ds_zero.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from ds_zero.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from ds_zero.utils.groups import ParallelGroups

logger = logging.getLogger(__name__)


class DeepSpeedEngine(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: DeepSpeedConfig, mpu=None,
                 lr_scheduler=None):
        """``lr_scheduler``: a schedule over ``optimizer``'s param groups, or a callable that builds one from the
        engine's (ZeRO) optimizer."""
        super().__init__()
        self._config = cfg = config
        self.mpu = mpu
        self.groups = ParallelGroups(mpu)
        self.dp_process_group = self.groups.dp_group
        self.dp_world_size = self.groups.dp_world_size
        self.mp_world_size = self.groups.mp_world_size
        self.global_rank = dist.get_rank()
        # A full disk is an error now, before the first collective, not at the first swap-out.
        check_nvme_space(cfg, [p for g in optimizer.param_groups for p in g["params"]], self.dp_world_size)
        self.module = model
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.compute_dtype = torch.float16 if cfg.fp16.enabled else torch.bfloat16 if cfg.bf16_enabled else None
        if self.compute_dtype is not None:
            model.to(self.compute_dtype)
            for p in model.parameters():
                if is_zero_param(p):
                    p.ds_tensor = p.ds_tensor.to(self.compute_dtype)
        self._broadcast_model()
        self.loss_scaler = create_loss_scaler(cfg.fp16, cfg.zero.stage)
        self.optimizer = self._configure_zero_optimizer(optimizer)
        builds = callable(lr_scheduler) and not hasattr(lr_scheduler, "step")
        self.lr_scheduler = lr_scheduler(self.optimizer) if builds else lr_scheduler
        self.training_dataloader = None  # ds_zero.initialize builds one from training_data
        if cfg.activation_checkpointing is not None:
            checkpointing.configure(mpu, deepspeed_config=cfg)
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self._step_applied = False  # whether the last step() updated the parameters
        self._stepped = False  # whether any optimizer step ran (the norm is None before, as DeepSpeed's)

    def _configure_zero_optimizer(self, basic):
        cfg, z = self._config, self._config.zero
        common = dict(groups=self.groups, offload_optimizer=z.offload_optimizer, device=self.device,
                      compute_dtype=self.compute_dtype)
        if z.stage == 3:
            nvme = None
            if "nvme" in (z.offload_optimizer.device, z.offload_param.device):
                nvme = ZeroInfinity.factory(z, cfg.aio)
            return DeepSpeedZeroOptimizer_Stage3(
                self.module, basic, self.loss_scaler, cfg.gradient_clipping,
                reduce_bucket_size=z.reduce_bucket_size, overlap_comm=z.overlap_comm,
                prefetch_bucket_size=z.prefetch_bucket_size, param_persistence_threshold=z.param_persistence_threshold,
                max_live_parameters=z.max_live_parameters, max_reuse_distance=z.max_reuse_distance,
                offload_param=z.offload_param, sub_group_size=z.sub_group_size, nvme=nvme, **common)
        return DeepSpeedZeroOptimizer(
            basic, self.loss_scaler, cfg.gradient_clipping, partition_grads=z.stage == 2,
            partition_optimizer=z.stage >= 1, reduce_bucket_size=z.reduce_bucket_size,
            allgather_bucket_size=z.allgather_bucket_size, overlap_comm=z.overlap_comm,
            contiguous_gradients=z.contiguous_gradients, reduce_scatter=z.reduce_scatter, **common)

    def _broadcast_model(self) -> None:
        """The data-parallel group's rank 0 weights everywhere in it (DeepSpeed's ``_broadcast_model``)."""
        src = self.groups.dp_src()
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if not is_zero_param(t) and t.numel():
                dist.broadcast(t.data, src=src, group=self.dp_process_group)

    # --- gradient accumulation -----------------------------------------------------------------
    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    # --- the training step --------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        stage3 = isinstance(self.optimizer, DeepSpeedZeroOptimizer_Stage3)
        if stage3:
            self.optimizer.coordinator.begin_phase("fwd")
        out = self.module(*inputs, **kwargs)
        if stage3 and not torch.is_grad_enabled():
            self.optimizer.coordinator.end_phase("fwd")
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Returns the loss divided by the accumulation steps when ``scale_wrt_gas`` (as DeepSpeed returns it)."""
        if not (torch.is_tensor(loss) and loss.numel() == 1 and loss.grad_fn is not None):
            raise ValueError(f"backward expects a one-element loss tensor with a grad_fn, got {loss!r}; for output "
                             "gradients call output.backward(gradient) on the engine's outputs")
        if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
            loss = loss / self.gradient_accumulation_steps()
        self.optimizer.backward_prologue(self.is_gradient_accumulation_boundary())
        (loss.float() * self.loss_scaler.loss_scale).backward(retain_graph=retain_graph)
        self.optimizer.post_backward(self.is_gradient_accumulation_boundary())
        return loss

    def step(self) -> None:
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            took = self.optimizer.step()
            self._stepped, self._step_applied = True, bool(took)
            if took:
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
            else:
                self.skipped_steps += 1
            self.global_steps += 1
            self.global_samples += self._config.train_batch_size
            every = self._config.steps_per_print
            if every is not None and self.global_steps % every == 0 and self.global_rank == 0:
                logger.info("step=%d, skipped=%d, lr=%s", self.global_steps, self.skipped_steps,
                            [g["lr"] for g in self.optimizer.param_groups])
        self.micro_steps += 1

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    # --- memory -------------------------------------------------------------------------------------
    def memory_breakdown(self) -> dict:
        return memory.memory_breakdown(self)

    def destroy(self) -> None:
        self.optimizer.destroy()
