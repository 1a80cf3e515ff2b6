"""``DeepSpeedEngine``: the training loop wrapper ``deepspeed.initialize`` returns (``deepspeed/runtime/engine.py``).

It owns the module (cast to fp16/bf16 when enabled), the ZeRO optimizer of the configured stage, the
loss scaler, the lr schedule and the micro-step counter that decides gradient-accumulation
boundaries. ``backward(loss)`` divides the loss by the accumulation steps (``scale_wrt_gas``) and
multiplies it by the loss scale; a torch-style ``output.backward(grad)`` on the engine's outputs gets
the same scaling from hooks on those outputs. ``step`` only updates on a boundary and never steps the
schedule on a skipped fp16 step. With an ``mpu`` the data-parallel group is the mpu's, and the
gradient norm and overflow checks also span its model-parallel group.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from ds_zero.config import DeepSpeedConfig
from ds_zero.engine_setup import build_basic_optimizer, check_nvme_space
from ds_zero.runtime.fp16.loss_scaler import create_loss_scaler
from ds_zero.runtime.lr_schedules import SCHEDULERS
from ds_zero.runtime.zero.partition_parameters import is_zero_param
from ds_zero.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from ds_zero.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from ds_zero.utils.groups import ParallelGroups, mpu_data_parallel_world_size

logger = logging.getLogger(__name__)


def _default_timeout() -> datetime.timedelta:
    return datetime.timedelta(minutes=int(os.environ.get("DEEPSPEED_TIMEOUT", "30")))  # DeepSpeed's default


def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True, distributed_port: int = 29500,
                     verbose: bool = True, timeout: datetime.timedelta | None = None, init_method: str | None = None,
                     dist_init_required: bool | None = None, config=None, rank: int = -1,
                     world_size: int = -1) -> None:
    """``deepspeed.init_distributed``: join the job torchrun (or the environment) describes. Without the launcher's
    variables it is one process on this machine (DeepSpeed tries MPI discovery there; mpi4py is not used here).
    ``dist_backend`` defaults to nccl with CUDA, else gloo; ``DEEPSPEED_TIMEOUT`` (minutes) sets the timeout."""
    if dist.is_initialized():
        return
    if dist_init_required is False:
        raise RuntimeError("torch.distributed is not initialised and dist_init_required=False; call "
                           "dist.init_process_group first")
    if config is not None:  # DeepSpeed reads only its comms-logger section from it; ds-zero has no comms logger
        logger.warning("init_distributed(config=...): DeepSpeed's comms logging is not built in ds_zero; ignored")
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout={timeout!r} must be a datetime.timedelta")
    if init_method is None:
        if verbose and "RANK" not in os.environ:
            logger.info("no launcher environment (RANK, WORLD_SIZE, ...): one process on 127.0.0.1:%d",
                        distributed_port)
        for key, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                             ("MASTER_PORT", str(distributed_port))):
            os.environ.setdefault(key, default)
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs = {"timeout": timeout or _default_timeout(), "init_method": init_method}
    if rank >= 0 or world_size >= 0:  # a tcp:// or file:// init_method needs them
        kwargs.update(rank=rank, world_size=world_size)
    dist.init_process_group(backend, **kwargs)


class DeepSpeedEngine(torch.nn.Module):
    def __init__(self, args=None, model: torch.nn.Module = None, optimizer=None, model_parameters=None,
                 training_data=None, lr_scheduler=None, mpu=None, dist_init_required=None, collate_fn=None,
                 config=None, config_class=None, distributed_port: int = 29500):
        super().__init__()
        if model is None:
            raise ValueError("initialize needs a model")
        # Validate everything before touching the process group, so bad input fails alone and fast.
        world = mpu_data_parallel_world_size(mpu)
        if world is None:
            world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
        self._config = config_class if config_class is not None else DeepSpeedConfig.load(config, world)
        cfg = self._config
        if optimizer is None and cfg.optimizer_name is None:
            raise ValueError("no optimizer: pass optimizer= or set the 'optimizer' config key")
        if optimizer is not None and cfg.optimizer_name is not None:
            raise ValueError("both a client optimizer and the 'optimizer' config key were given; use one")
        if model_parameters is None:
            model_parameters = model.parameters()
        model_parameters = list(model_parameters)
        check_nvme_space(cfg, model_parameters, world)
        init_distributed(dist_init_required=dist_init_required, distributed_port=distributed_port)
        self.mpu = mpu
        self.groups = ParallelGroups(mpu)
        self.dp_process_group = self.groups.dp_group
        self.dp_world_size = self.groups.dp_world_size
        self.mp_world_size = self.groups.mp_world_size
        self.global_rank = dist.get_rank()
        self.module = model
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.compute_dtype = torch.float16 if cfg.fp16.enabled else torch.bfloat16 if cfg.bf16_enabled else None
        if self.compute_dtype is not None:
            model.to(self.compute_dtype)
            for p in model.parameters():
                if is_zero_param(p):
                    p.ds_tensor = p.ds_tensor.to(self.compute_dtype)
        self._broadcast_model()
        z = cfg.zero
        if optimizer is None:
            basic = build_basic_optimizer(cfg.optimizer_name, cfg.optimizer_params, model_parameters,
                                          offload=z.offload_optimizer.enabled)
        elif isinstance(optimizer, torch.optim.Optimizer):
            basic = optimizer
        elif callable(optimizer):
            basic = optimizer(model_parameters)
        else:
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or a callable, got {type(optimizer).__name__}")
        self.loss_scaler = create_loss_scaler(cfg.fp16, z.stage)
        self.optimizer = self._configure_zero_optimizer(basic)
        self.lr_scheduler = self._configure_lr_scheduler(lr_scheduler)
        self.training_dataloader = self._configure_dataloader(training_data, collate_fn)
        if "activation_checkpointing" in cfg.raw:
            from ds_zero.runtime.activation_checkpointing import checkpointing

            checkpointing.configure(mpu, deepspeed_config=cfg)
        self.micro_steps = 0
        self.global_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self._step_applied = False
        self._stepped = False  # get_global_grad_norm is None until the first optimizer step, as DeepSpeed's
        self._in_engine_backward = False
        self._torch_style_backward = False

    def _configure_zero_optimizer(self, basic):
        cfg, z = self._config, self._config.zero
        common = dict(groups=self.groups, offload_optimizer=z.offload_optimizer, device=self.device,
                      compute_dtype=self.compute_dtype)
        if z.stage == 3:
            nvme = None
            if "nvme" in (z.offload_optimizer.device, z.offload_param.device):
                from ds_zero.runtime.swap_tensor.zero_infinity import ZeroInfinity

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

    def _configure_lr_scheduler(self, client):
        if client is not None:
            return client(self.optimizer) if callable(client) and not hasattr(client, "step") else client
        if self._config.scheduler_name is None:
            return None
        return SCHEDULERS[self._config.scheduler_name](self.optimizer, **self._config.scheduler_params)

    def _configure_dataloader(self, data, collate_fn):
        if data is None:
            return None
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=self.dp_world_size,
                                                      rank=self.groups.dp_rank)
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

    def steps_per_print(self) -> int | None:
        return self._config.steps_per_print

    def zero_optimization_stage(self) -> int:
        return self._config.zero.stage

    def fp16_enabled(self) -> bool:
        return self._config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self._config.bf16_enabled

    @property
    def config(self) -> DeepSpeedConfig:
        return self._config

    def loss_scale(self) -> float:
        """The configured ``fp16.loss_scale`` (0 = dynamic), as DeepSpeed's; the current scale is
        ``engine.optimizer.loss_scale`` (or ``cur_scale``)."""
        return self._config.fp16.loss_scale

    def was_step_applied(self) -> bool:
        """Whether the last ``step()`` updated the parameters (False off a boundary or on an fp16 overflow)."""
        return self._step_applied

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_global_grad_norm(self):
        """The last step's gradient norm: a 0-dim tensor at ZeRO stages 1-3, a float at stage 0, inf after an
        overflow, None before the first step (DeepSpeed's types)."""
        return self.optimizer.get_global_grad_norm() if self._stepped else None

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

    # --- the training step --------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        stage3 = isinstance(self.optimizer, DeepSpeedZeroOptimizer_Stage3)
        if stage3:
            self.optimizer.coordinator.begin_phase("fwd")
        out = self.module(*inputs, **kwargs)
        if stage3 and not torch.is_grad_enabled():
            self.optimizer.coordinator.end_phase("fwd")
        if torch.is_grad_enabled():
            for leaf in pytree.tree_leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
                    leaf.register_hook(self._output_grad_hook)
        return out

    def _backward_prologue(self) -> None:
        self.optimizer.backward_prologue(self.is_gradient_accumulation_boundary())

    def _backward_epilogue(self) -> None:
        self.optimizer.post_backward(self.is_gradient_accumulation_boundary())

    def _output_grad_hook(self, grad):
        """``output.backward(grad)`` without ``engine.backward``: scale like it, and finish the micro-step after."""
        if self._in_engine_backward:
            return None
        if not self._torch_style_backward:
            self._torch_style_backward = True
            self._backward_prologue()

            def done():
                self._torch_style_backward = False
                self._backward_epilogue()

            torch.autograd.Variable._execution_engine.queue_callback(done)
        return grad * (self.loss_scaler.loss_scale / self.gradient_accumulation_steps())

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """Returns the loss divided by the accumulation steps when ``scale_wrt_gas`` (as DeepSpeed returns it)."""
        if not (torch.is_tensor(loss) and loss.numel() == 1 and loss.grad_fn is not None):
            raise ValueError(f"backward expects a one-element loss tensor with a grad_fn, got {loss!r}; for output "
                             "gradients call output.backward(gradient) on the engine's outputs")
        self._in_engine_backward = True
        try:
            if scale_wrt_gas and self.gradient_accumulation_steps() > 1:
                loss = loss / self.gradient_accumulation_steps()
            self._backward_prologue()
            (loss.float() * self.loss_scaler.loss_scale).backward(retain_graph=retain_graph)
            self._backward_epilogue()
        finally:
            self._in_engine_backward = False
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
            self.global_samples += self.train_batch_size()
            every = self.steps_per_print()
            if every is not None and self.global_steps % every == 0 and self.global_rank == 0:
                logger.info("step=%d, skipped=%d, lr=%s", self.global_steps, self.skipped_steps, self.get_lr())
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
