"""``DeepSpeedEngine``: the training loop wrapper ``deepspeed.initialize`` returns (``deepspeed/runtime/engine.py``).

It owns the module (cast to fp16/bf16 when enabled), the ZeRO optimizer of the configured stage, the
loss scaler, the lr schedule and the micro-step counter that decides gradient-accumulation
boundaries. ``backward`` divides the loss by the accumulation steps and multiplies it by the loss
scale (as DeepSpeed does); ``step`` only updates on a boundary and never steps the schedule on a
skipped fp16 step.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from ds_zero.config import DeepSpeedConfig
from ds_zero.runtime.fp16.loss_scaler import create_loss_scaler
from ds_zero.runtime.lr_schedules import SCHEDULERS
from ds_zero.runtime.zero.partition_parameters import is_zero_param
from ds_zero.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from ds_zero.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

logger = logging.getLogger(__name__)


def _build_basic_optimizer(name: str, params: dict, model_parameters) -> torch.optim.Optimizer:
    kwargs = dict(params)
    if name in ("Adam", "AdamW"):
        kwargs.pop("torch_adam", None)
        adam_w_mode = kwargs.pop("adam_w_mode", True)
        # As in DeepSpeed: type "Adam" means decoupled weight decay unless adam_w_mode is false.
        cls = torch.optim.AdamW if (name == "AdamW" or adam_w_mode) else torch.optim.Adam
        if "betas" in kwargs:
            kwargs["betas"] = tuple(kwargs["betas"])
        return cls(model_parameters, **kwargs)
    return torch.optim.SGD(model_parameters, **kwargs)


class DeepSpeedEngine(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, config, model_parameters=None, optimizer=None, lr_scheduler=None,
                 training_data=None, collate_fn=None, mpu=None, dist_init_required=None):
        super().__init__()
        # Validate everything before touching the process group, so bad input fails alone and fast.
        world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
        self._config = DeepSpeedConfig.load(config, world)
        if mpu is not None:
            raise ValueError("mpu (model parallelism) is not supported by ds_zero; pass mpu=None")
        if not dist.is_initialized():
            raise RuntimeError("ds_zero needs torch.distributed initialised (e.g. dist.init_process_group('gloo'))")
        self.dp_process_group = None
        self.dp_world_size = dist.get_world_size()
        self.global_rank = dist.get_rank()
        cfg = self._config
        if optimizer is None and cfg.optimizer_name is None:
            raise ValueError("no optimizer: pass optimizer= or set the 'optimizer' config key")
        if optimizer is not None and cfg.optimizer_name is not None:
            raise ValueError("both a client optimizer and the 'optimizer' config key were given; use one")
        self.module = model
        self.compute_dtype = torch.float16 if cfg.fp16.enabled else torch.bfloat16 if cfg.bf16_enabled else None
        stage = cfg.zero.stage
        if self.compute_dtype is not None:
            model.to(self.compute_dtype)
            for p in model.parameters():
                if is_zero_param(p):
                    p.ds_tensor = p.ds_tensor.to(self.compute_dtype)
        self._broadcast_model()
        if model_parameters is None:
            model_parameters = model.parameters()
        model_parameters = list(model_parameters)
        if optimizer is None:
            basic = _build_basic_optimizer(cfg.optimizer_name, cfg.optimizer_params, model_parameters)
        elif isinstance(optimizer, torch.optim.Optimizer):
            basic = optimizer
        elif callable(optimizer):
            basic = optimizer(model_parameters)
        else:
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or a callable, got {type(optimizer).__name__}")
        self.loss_scaler = create_loss_scaler(cfg.fp16)
        z = cfg.zero
        master_device = torch.device("cpu") if z.offload_optimizer_device == "cpu" else None
        if stage == 3:
            self.optimizer = DeepSpeedZeroOptimizer_Stage3(
                model, basic, self.loss_scaler, cfg.gradient_clipping, self.dp_process_group,
                reduce_bucket_size=z.reduce_bucket_size, overlap_comm=z.overlap_comm,
                prefetch_bucket_size=z.stage3_prefetch_bucket_size,
                param_persistence_threshold=z.stage3_param_persistence_threshold,
                max_live_parameters=z.stage3_max_live_parameters, master_device=master_device,
                compute_dtype=self.compute_dtype)
        else:
            self.optimizer = DeepSpeedZeroOptimizer(
                basic, self.loss_scaler, cfg.gradient_clipping, self.dp_process_group,
                partition_grads=stage == 2, partition_optimizer=stage >= 1,
                reduce_bucket_size=z.reduce_bucket_size, allgather_bucket_size=z.allgather_bucket_size,
                overlap_comm=z.overlap_comm, contiguous_gradients=z.contiguous_gradients,
                reduce_scatter=z.reduce_scatter,
                master_device=master_device)
        self.lr_scheduler = self._configure_lr_scheduler(lr_scheduler)
        self.training_dataloader = self._configure_dataloader(training_data, collate_fn)
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0

    def _broadcast_model(self) -> None:
        """Rank 0's initial weights everywhere (DeepSpeed's ``_broadcast_model``)."""
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            if not is_zero_param(t) and t.numel():
                dist.broadcast(t.data, src=0, group=self.dp_process_group)

    def _configure_lr_scheduler(self, client):
        if client is not None:
            return client(self.optimizer) if callable(client) and not hasattr(client, "step") else client
        if self._config.scheduler_name is None:
            return None
        return SCHEDULERS[self._config.scheduler_name](self.optimizer, **self._config.scheduler_params)

    def _configure_dataloader(self, data, collate_fn):
        if data is None:
            return None
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=self.dp_world_size, rank=self.global_rank)
        return torch.utils.data.DataLoader(data, batch_size=self.train_micro_batch_size_per_gpu(), sampler=sampler,
                                           collate_fn=collate_fn)

    # --- the batch triangle -------------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def zero_optimization_stage(self) -> int:
        return self._config.zero.stage

    @property
    def config(self) -> DeepSpeedConfig:
        return self._config

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        return self.optimizer.get_global_grad_norm()

    # --- the training step --------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        stage3 = isinstance(self.optimizer, DeepSpeedZeroOptimizer_Stage3)
        if stage3:
            self.optimizer.coordinator.begin_phase("fwd")
        out = self.module(*inputs, **kwargs)
        if stage3 and not torch.is_grad_enabled():
            self.optimizer.coordinator.end_phase("fwd")
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False):
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError(f"backward expects a scalar loss tensor, got {loss!r}")
        scaled = loss.float()
        gas = self.gradient_accumulation_steps()
        if gas > 1:
            scaled = scaled / gas
        scaled = scaled * self.loss_scaler.loss_scale
        if isinstance(self.optimizer, DeepSpeedZeroOptimizer_Stage3):
            self.optimizer.coordinator.begin_phase("bwd")
        scaled.backward(retain_graph=retain_graph)
        self.optimizer.post_backward(self.is_gradient_accumulation_boundary())
        return loss

    def step(self) -> None:
        if self.is_gradient_accumulation_boundary():
            took = self.optimizer.step()
            if took:
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
            else:
                self.skipped_steps += 1
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
        self.micro_steps += 1

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    # --- checkpoints and memory -----------------------------------------------------------------
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True) -> bool:
        from ds_zero.checkpoint import save_checkpoint

        return save_checkpoint(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True):
        from ds_zero.checkpoint import load_checkpoint

        return load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states)

    def memory_breakdown(self) -> dict:
        from ds_zero.memory import memory_breakdown

        return memory_breakdown(self)

    def destroy(self) -> None:
        self.optimizer.destroy()
