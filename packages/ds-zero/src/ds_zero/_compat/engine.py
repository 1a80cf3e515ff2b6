"""What DeepSpeed's engines offer beyond the training step (``deepspeed/runtime/engine.py``), over the core's
:class:`ds_zero.engine.DeepSpeedEngine` and :class:`ds_zero.pipe.engine.PipelineEngine`: checkpoints in DeepSpeed's
layout, the attributes DeepSpeed's tests and users read, the wrapped module's attributes through the engine, and
torch-style ``output.backward(grad)`` on the engine's outputs."""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from ds_zero import engine
from ds_zero._compat import checkpoint, tensor_fragment
from ds_zero._compat.accelerator import get_accelerator
from ds_zero.pipe import engine as pipe_engine
from ds_zero.runtime.zero.partition_parameters import GatheredParameters, is_zero_param

logger = logging.getLogger(__name__)


class DeepSpeedEngineAPI:
    """DeepSpeed's engine methods that the training step itself does not need; both engines have them."""

    client_optimizer = None  # the optimizer the caller passed to initialize (DeepSpeed's attribute)
    client_lr_scheduler = None

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest: bool = True) -> bool:
        return checkpoint.save_checkpoint(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_optimizer_states: bool = True,
                        load_lr_scheduler_states: bool = True):
        """Returns ``(load_path, client_state)``, or ``(None, None)`` when there is no ``latest`` (as DeepSpeed)."""
        return checkpoint.load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states)

    def _init_distributed_vars(self) -> None:
        """``local_rank`` from ``LOCAL_RANK`` (the launcher's; DeepSpeed requires it), ``world_size`` and the device
        the accelerator names for it (DeepSpeed's ``_configure_with_arguments`` / ``_set_distributed_vars``)."""
        self.local_rank = int(os.environ.get("LOCAL_RANK", -1))
        self.world_size = dist.get_world_size()
        self.dist_backend = get_accelerator().communication_backend_name()
        self.gradient_average = True
        self.enable_backward_allreduce = True
        if self._config.zero.stage >= 1 or self.bfloat16_enabled():  # DeepSpeed's optimizers with hp mappings
            tensor_fragment.link_params(self.optimizer)

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

    def _get_optimizer_param(self, name: str) -> list:
        """Each group's value, 0.0 where a group has none (as DeepSpeed reads them)."""
        return [g.get(name, 0.0) for g in self.optimizer.param_groups] if self.optimizer else []

    def get_lr(self) -> list[float]:
        return self._get_optimizer_param("lr")

    def get_mom(self) -> list:
        """``momentum`` for SGD and RMSprop, else the Adam ``betas`` of each group."""
        return self._get_optimizer_param("momentum" if self.optimizer_name() in ("SGD", "RMSprop") else "betas")

    def get_type(self) -> list:
        return self._get_optimizer_param("type")

    def optimizer_name(self) -> str | None:
        """The client optimizer's class name, else the config's type as DeepSpeed spells it (lower case)."""
        if self.client_optimizer is not None:
            return type(self.client_optimizer).__name__
        return None if self._config.optimizer_name is None else self._config.optimizer_name.lower()

    def optimizer_params(self) -> dict | None:
        return self._config.raw.get("optimizer", {}).get("params")

    def scheduler_name(self) -> str | None:
        return self._config.scheduler_name

    def scheduler_params(self) -> dict | None:
        return self._config.raw.get("scheduler", {}).get("params")

    def gradient_clipping(self) -> float:
        return self._config.gradient_clipping

    def dynamic_loss_scale(self) -> bool:
        return self._config.fp16.loss_scale == 0

    def initial_dynamic_scale(self) -> int:
        return 2 ** self._config.fp16.initial_scale_power

    def dynamic_loss_scale_args(self) -> dict:
        f = self._config.fp16
        return {"init_scale": 2 ** f.initial_scale_power, "scale_window": f.loss_scale_window,
                "delayed_shift": f.hysteresis, "consecutive_hysteresis": f.consecutive_hysteresis,
                "min_scale": f.min_loss_scale}

    def wall_clock_breakdown(self) -> bool:
        return bool(self._config.raw.get("wall_clock_breakdown", False))

    def zero_optimization(self) -> bool:
        return self._config.zero.stage > 0

    def zero_optimization_partition_gradients(self) -> bool:
        return self._config.zero.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self._config.zero.stage >= 3

    def zero_cpu_offload(self) -> bool:
        return self._config.zero.offload_optimizer.device == "cpu"

    def zero_use_cpu_optimizer(self) -> bool:
        return self._config.zero.offload_optimizer.device in ("cpu", "nvme")

    def zero_reduce_scatter(self) -> bool:
        return self._config.zero.reduce_scatter

    def zero_overlap_comm(self) -> bool:
        return self._config.zero.overlap_comm

    def zero_contiguous_gradients(self) -> bool:
        return self._config.zero.contiguous_gradients

    def zero_reduce_bucket_size(self) -> int:
        return self._config.zero.reduce_bucket_size

    def zero_allgather_bucket_size(self) -> int:
        return self._config.zero.allgather_bucket_size

    def zero_sub_group_size(self) -> int:
        return self._config.zero.sub_group_size

    def zero_prefetch_bucket_size(self) -> int:
        return self._config.zero.prefetch_bucket_size

    def zero_param_persistence_threshold(self) -> int:
        return self._config.zero.param_persistence_threshold

    def zero_max_live_parameters(self) -> int:
        return self._config.zero.max_live_parameters

    def zero_max_reuse_distance(self) -> int:
        return self._config.zero.max_reuse_distance

    def get_data_parallel_rank(self) -> int:
        return self.groups.dp_rank

    def get_model_parallel_rank(self) -> int:
        return 0 if self.mpu is None else self.mpu.get_model_parallel_rank()

    def train(self, mode: bool = True) -> None:
        """Switches the wrapped module only and returns None, as DeepSpeed's engine does."""
        self.module.train(mode)

    def eval(self) -> None:
        self.module.train(False)

    def module_state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False,
                          exclude_frozen_parameters: bool = False) -> dict:
        sd = self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        if exclude_frozen_parameters:
            for n, p in self.module.named_parameters():
                if not p.requires_grad:
                    sd.pop(prefix + n, None)
        return sd

    # --- what DeepSpeed's users reach for beyond the step -----------------------------------------------------
    def get_batch_info(self) -> tuple:
        """The getters of the global batch, the micro-batch and the accumulation steps: DeepSpeed 0.19's returns the
        bound methods, not their values, and code written for it calls them; so does this one."""
        return self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """A new global batch at the same micro-batch: the gradient accumulation steps change (DeepSpeed's)."""
        per_step = self.train_micro_batch_size_per_gpu() * self.dp_world_size
        if train_batch_size % per_step != 0:
            raise ValueError("Train batch size must be divisible by micro-batch data parallelism")
        self._config.train_batch_size = train_batch_size
        self._config.gradient_accumulation_steps = train_batch_size // per_step

    def set_train_micro_batch_size(self, micro_batch_size: int) -> None:
        """A new micro-batch at the same accumulation steps: the global batch changes (DeepSpeed's)."""
        self._config.train_batch_size = micro_batch_size * self.gradient_accumulation_steps() * self.dp_world_size
        self._config.train_micro_batch_size_per_gpu = micro_batch_size

    def _raw_zero(self) -> dict:
        z = getattr(self._config, "raw", {}).get("zero_optimization", {})
        return z if isinstance(z, dict) else {}

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        z = self._raw_zero()
        for key in ("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
                    "stage3_gather_fp16_weights_on_model_save"):
            if key in z:
                return bool(z[key])
        return False

    def dataloader_drop_last(self) -> bool:
        return bool(getattr(self._config, "raw", {}).get("dataloader_drop_last", False))

    def zero_offload_optimizer(self):
        """The ``offload_optimizer`` section, None when it offloads nothing (DeepSpeed's)."""
        return self._config.zero.offload_optimizer if self._config.zero.offload_optimizer.device != "none" else None

    def zero_offload_param(self):
        return self._config.zero.offload_param if self._config.zero.offload_param.device != "none" else None

    @staticmethod
    def is_map_style_dataset(obj) -> bool:
        return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")

    @staticmethod
    def is_iterable_style_dataset(obj) -> bool:
        return isinstance(obj, torch.utils.data.IterableDataset)

    def deepspeed_io(self, dataset, batch_size=None, route: str = "train", pin_memory: bool = True, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """A loader of this data-parallel rank's share of ``dataset`` in micro-batches, as DeepSpeed's engine builds
        one: shuffled (torch's ``DistributedSampler``, seed 0) for ``route="train"``, in order for ``"eval"`` /
        ``"predict"``; ``dataloader_drop_last`` from the config."""
        if not (self.is_map_style_dataset(dataset) or self.is_iterable_style_dataset(dataset)):
            raise ValueError("Training data must be a torch Dataset")
        if data_sampler is None and not self.is_iterable_style_dataset(dataset):
            data_sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=self.dp_world_size,
                                                               rank=self.groups.dp_rank, shuffle=route == "train")
        return torch.utils.data.DataLoader(
            dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(), sampler=data_sampler,
            collate_fn=collate_fn or getattr(self, "collate_fn", None), num_workers=num_local_io_workers or 0,
            pin_memory=pin_memory and get_accelerator().device_name() != "cpu", drop_last=self.dataloader_drop_last())

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """The model's 16-bit (its own dtype) state dict in ``save_dir/save_filename``, written by rank 0; every rank
        calls it. At stage 3 the partitioned weights are gathered only with ``stage3_gather_16bit_weights_on_model
        _save``; without it nothing is saved and False returned, as DeepSpeed does."""
        path = os.path.join(save_dir, save_filename)
        if self._config.zero.stage == 3:
            if not self.zero_gather_16bit_weights_on_model_save():
                logger.info("Did not save the model %s because stage3_gather_16bit_weights_on_model_save is False",
                            path)
                return False
            with GatheredParameters(list(self.module.parameters()), modifier_rank=None):
                state_dict = {k: v.detach().clone() for k, v in
                              self.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters).items()}
        else:
            state_dict = self.module_state_dict(exclude_frozen_parameters=exclude_frozen_parameters)
        if dist.get_rank() == 0:
            os.makedirs(save_dir, exist_ok=True)
            logger.info("Saving model weights to %s, tag: global_step%d", path, self.global_steps)
            torch.save(state_dict, path)
        return True

    def save_fp16_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                        exclude_frozen_parameters: bool = False) -> bool:
        """Older name of :meth:`save_16bit_model`."""
        return self.save_16bit_model(save_dir, save_filename, exclude_frozen_parameters)

    def load_module_state_dict(self, checkpoint, strict: bool = True, custom_load_fn=None,
                               fetch_z3_params: bool = False) -> None:
        """``checkpoint['module']`` into the wrapped module (through ``custom_load_fn(src=, dst=)`` if given; with
        ``fetch_z3_params`` the ZeRO-3 partitions gathered, loaded on every rank, and partitioned again)."""
        params = list(self.module.parameters()) if fetch_z3_params else []
        with GatheredParameters(params, modifier_rank=0, enabled=fetch_z3_params):
            if custom_load_fn is not None:
                custom_load_fn(src=checkpoint["module"], dst=self.module)
            else:
                self.module.load_state_dict(checkpoint["module"], strict=strict)

    def was_step_applied(self) -> bool:
        """Whether the last ``step()`` updated the parameters (False off a boundary or on an fp16 overflow)."""
        return self._step_applied

    def get_global_grad_norm(self):
        """The last step's gradient norm: a 0-dim tensor at ZeRO stages 1-3, a float at stage 0 in fp16/bf16, inf
        after an overflow, None before the first step (DeepSpeed's types). None at stage 0 in fp32 too: DeepSpeed
        then steps the bare torch optimizer, which keeps no norm."""
        bare = self._config.zero.stage == 0 and not (self.fp16_enabled() or self.bfloat16_enabled())
        return self.optimizer.get_global_grad_norm() if self._stepped and not bare else None

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


def _initialize_optimizer_states(zero_optimizer) -> None:
    """DeepSpeed's stage-0 fp16/bf16 wrappers (``FP16_Optimizer`` / ``FP16_UnfusedOptimizer``) build the torch
    optimizer's state with one ``step()`` on zero gradients when they are created
    (``initialize_optimizer_states``): Adam's step count starts one ahead and decoupled weight decay has applied
    once to the fp32 master, so the first real update is smaller than a fresh Adam's. Done here as DeepSpeed does,
    so the same config trains to the same losses; the low-precision parameters are left as they are."""
    masters = [p for g in zero_optimizer.optimizer.param_groups for p in g["params"]]
    grads = [p.grad for p in masters]
    for p in masters:
        p.grad = torch.zeros_like(p)
    zero_optimizer.optimizer.step()
    for p, g in zip(masters, grads):
        p.grad = g


def _to_accelerator(model: torch.nn.Module) -> None:
    """DeepSpeed's engine moves the module to its accelerator's device for ``LOCAL_RANK``
    (``_configure_distributed_model``); a model built partitioned by ``zero.Init`` is already placed."""
    accel, local_rank = get_accelerator(), int(os.environ.get("LOCAL_RANK", -1))
    if accel.device_name() == "cpu" or local_rank < 0 or any(is_zero_param(p) for p in model.parameters()):
        return
    accel.set_device(local_rank)
    model.to(torch.device(accel.device_name(local_rank)))


class DeepSpeedEngine(DeepSpeedEngineAPI, engine.DeepSpeedEngine):
    """``output.backward(grad)`` without ``engine.backward``: hooks on the outputs scale the gradient as
    ``engine.backward`` scales the loss, and finish the micro-step after autograd is done."""

    def __init__(self, model, *args, **kwargs):
        _to_accelerator(model)
        super().__init__(model, *args, **kwargs)
        self._init_distributed_vars()
        if self._config.zero.stage == 0 and (self.fp16_enabled() or self.bfloat16_enabled()):
            _initialize_optimizer_states(self.optimizer)  # DeepSpeed's FP16 / DDP_BFLOAT16 wrappers
        self._in_engine_backward = False
        self._torch_style_backward = False
        self._forced_boundary = None

    def is_gradient_accumulation_boundary(self) -> bool:
        if self._forced_boundary is not None:
            return self._forced_boundary
        return super().is_gradient_accumulation_boundary()

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Make every following micro-step a boundary or not, for loops that call ``step()`` once per batch
        (DeepSpeed's override of the micro-step count)."""
        self._forced_boundary = is_boundary

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
        self._init_distributed_vars()
        if self._config.zero.stage == 0 and self.fp16_enabled():  # bf16 pipelines get DeepSpeed's BF16_Optimizer
            _initialize_optimizer_states(self.optimizer)
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
