"""``PipelineEngine``: executes a pipeline schedule's instructions for one stage (DeepSpeed's
``deepspeed/runtime/pipe/engine.py``).

``train_batch`` runs ``gradient_accumulation_steps`` micro-batches through :class:`TrainSchedule` (1F1B):
``LoadMicroBatch`` reads inputs (first stage) or labels (last), ``ForwardPass``/``BackwardPass`` run the
stage's layers, the send/receive instructions move activations forward and their gradients back (shapes
described once per batch), an output is freed as soon as it has been sent (Megatron's
``deallocate_output_tensor``: backward needs its graph, not its values), and the batch ends with
``ReduceTiedGrads``, ``ReduceGrads`` (the ZeRO optimizer's data-parallel reduction) and ``OptimizerStep``.
Data parallelism and ZeRO stage 0/1 run across the grid's data-parallel group; the norm and overflow
checks span the pipeline (the grid is the engine's ``mpu``).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from ds_zero.engine import DeepSpeedEngine
from ds_zero.pipe import schedule
from ds_zero.pipe.module import PipelineError, PipelineModule
from ds_zero.pipe.p2p import P2P, _as_tuple
from ds_zero.runtime.config import DeepSpeedConfig
from ds_zero.runtime.config_utils import DeepSpeedConfigError

logger = logging.getLogger(__name__)


class PipelineEngine(DeepSpeedEngine):
    def __init__(self, model: PipelineModule, optimizer: torch.optim.Optimizer, config: DeepSpeedConfig,
                 lr_scheduler=None):
        """``config``'s batch triangle is solved for the grid's data-parallel size (``model.mpu()``)."""
        # Validate before the engine communicates (its model broadcast is the first collective).
        if config.zero.stage >= 2:
            raise DeepSpeedConfigError(
                f"config key 'zero_optimization.stage' has invalid value {config.zero.stage} for "
                "pipeline parallelism; allowed: 0 or 1 (as in DeepSpeed)"
            )
        if config.gradient_accumulation_steps < model.num_stages:
            logger.warning(
                "%d micro-batches for %d pipeline stages: each stage idles %.0f%% of the batch "
                "(bubble (p-1)/(m+p-1)); use gradient_accumulation_steps >= stages",
                config.gradient_accumulation_steps,
                model.num_stages,
                100 * (model.num_stages - 1) / (config.gradient_accumulation_steps + model.num_stages - 1),
            )
        grid = model.mpu()
        super().__init__(model, optimizer, config, mpu=grid, lr_scheduler=lr_scheduler)
        self.grid = grid
        self.num_stages = grid.get_pipe_parallel_world_size()
        self.stage_id = grid.get_stage_id()
        self.micro_batches = self.gradient_accumulation_steps()
        self.is_first_stage, self.is_last_stage = grid.is_first_stage, grid.is_last_stage
        self.prev_rank = grid.stage_to_global(self.stage_id - 1) if not self.is_first_stage else None
        self.next_rank = grid.stage_to_global(self.stage_id + 1) if not self.is_last_stage else None
        self.p2p = P2P(self.device)
        if config.pipeline_activation_checkpoint_interval:  # DeepSpeed lets the config set it too
            self.module.activation_checkpoint_interval = config.pipeline_activation_checkpoint_interval
        # ds_zero's addition: the schedule train_batch runs (GPipeSchedule for comparison with 1F1B).
        self.train_schedule = schedule.TrainSchedule
        self.timeline: list[tuple] = []  # (kind, micro_batch, start, end) of the last batch
        self._last_mb = None
        self.agg_train_loss = None
        self._data_iter = None

    # --- public API ---------------------------------------------------------------------------------------------
    def train_batch(self, data_iter=None) -> torch.Tensor:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches; returns the mean loss everywhere."""
        if not torch.is_grad_enabled():
            raise PipelineError("train_batch() needs gradients enabled (it runs backward)")
        self.module.train()
        self._set_data_iter(data_iter)
        self._exec_schedule(self.train_schedule(self.micro_batches, self.num_stages, self.stage_id))
        self.agg_train_loss = self._aggregate_total_loss()
        return self.agg_train_loss

    def eval_batch(
        self,
        data_iter,
        return_logits: bool = False,
        compute_loss: bool = True,
        reduce_output: str = "avg",
        bcast_loss: bool = True,
        num_micro_batches=None,
    ):
        self.module.eval()
        self._set_data_iter(data_iter)
        micro = num_micro_batches or self.micro_batches
        self._compute_loss = compute_loss
        with torch.no_grad():
            self._exec_schedule(schedule.InferenceSchedule(micro, self.num_stages, self.stage_id))
        self._compute_loss = True
        loss = self._aggregate_total_loss(reduce=reduce_output, bcast=bcast_loss) if compute_loss else None
        self.module.train()
        if return_logits:
            return loss, self._logits if self.is_last_stage else None
        return loss

    def set_dataiterator(self, iterator) -> None:
        self._data_iter = iterator

    def forward(self, *args, **kwargs):
        raise PipelineError("Only train_batch() is accessible in pipeline mode.")

    def backward(self, *args, **kwargs):
        raise PipelineError("Only train_batch() is accessible in pipeline mode.")

    def step(self, *args, **kwargs):
        raise PipelineError("Only train_batch() is accessible in pipeline mode.")

    # --- the schedule interpreter --------------------------------------------------------------------------
    def _set_data_iter(self, data_iter) -> None:
        if data_iter is not None:
            self._data_iter = data_iter
        elif self._data_iter is None and self.training_dataloader is not None:
            self._data_iter = iter(self.training_dataloader)
        if self._data_iter is None and (self.is_first_stage or self.is_last_stage):
            raise PipelineError("the first and last stages need data: pass data_iter or training_data")

    def _exec_schedule(self, sched: schedule.PipeSchedule) -> None:
        n = sched.num_pipe_buffers()
        self.buffers = {k: [None] * n for k in ("inputs", "labels", "outputs", "output_grads", "input_grads")}
        self._losses, self._logits = [], []
        self._meta_sent = self._meta_received = None  # descriptions travel with the batch's first micro-batch
        self._pending: list = []
        # The next activation / gradient receive is posted as soon as the previous one arrived, so the
        # neighbour's send finds it waiting (gloo otherwise first exchanges ready notices).
        self._posted = {"act": None, "grad": None}
        self._recvd = {"act": 0, "grad": 0}
        self._sched_micro_batches = sched.micro_batches
        self._fwd_id = self._bwd_id = 0
        self.timeline = []
        for cmds in sched:
            for cmd in cmds:
                start = time.perf_counter()
                getattr(self, self._INSTRUCTION_MAP[type(cmd)])(**cmd.kwargs)
                self.timeline.append((cmd.name, getattr(self, "_last_mb", None), start, time.perf_counter()))
                self._last_mb = None
            self._finish_sends()

    def _finish_sends(self) -> None:
        """The neighbour received within this tick; free what was sent (its graph stays for backward)."""
        for works, tensors, free in self._pending:
            for w in works:
                w.wait()
            if free:
                for t in tensors:
                    if t.requires_grad and t._base is None:
                        t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        self._pending = []

    def _next_batch(self):
        try:
            return next(self._data_iter)
        except StopIteration:
            raise PipelineError("the data iterator ran out inside a batch") from None

    def _to_device(self, x):
        if isinstance(x, (tuple, list)):
            return tuple(t.detach().to(self.device, copy=True) for t in x)
        return x.detach().to(self.device, copy=True)

    def _exec_load_micro_batch(self, buffer_id: int) -> None:
        inputs, labels = self._next_batch()
        if self.is_first_stage:
            inputs = self._to_device(inputs)
            # As DeepSpeed does: float inputs require grad, so a checkpointed first layer still gets gradients
            # (reentrant checkpointing differentiates through its inputs).
            for t in _as_tuple(inputs):
                if t.is_floating_point() and torch.is_grad_enabled():
                    t.requires_grad_(True)
            self.buffers["inputs"][buffer_id] = inputs
        if self.is_last_stage:
            self.buffers["labels"][buffer_id] = self._to_device(labels)

    def _exec_forward_pass(self, buffer_id: int) -> None:
        self._last_mb = self._fwd_id
        self._fwd_id += 1
        outputs = self.module(self.buffers["inputs"][buffer_id])
        if self.is_last_stage:
            if self.module.loss_fn is not None and getattr(self, "_compute_loss", True):
                loss = self.module.loss_fn(outputs, self.buffers["labels"][buffer_id])
                self._losses.append(loss.detach().float())
                self.buffers["outputs"][buffer_id] = loss
            else:
                self.buffers["outputs"][buffer_id] = outputs
            if not torch.is_grad_enabled():
                self._logits.append(outputs)
        else:
            self.buffers["outputs"][buffer_id] = outputs

    def _exec_backward_pass(self, buffer_id: int) -> None:
        self._last_mb = self._bwd_id
        self._bwd_id += 1
        self.optimizer.backward_prologue(False)  # the data-parallel reduction waits for ReduceGrads
        if self.is_last_stage:
            loss = self.buffers["outputs"][buffer_id]
            (loss.float() * (self.loss_scaler.loss_scale / self.micro_batches)).backward()
        else:
            outputs = _as_tuple(self.buffers["outputs"][buffer_id])
            pairs = [
                (o, g) for o, g in zip([o for o in outputs if o.requires_grad], self.buffers["output_grads"][buffer_id])
            ]
            # The outputs were freed after sending: skip torch's shape check (Megatron's custom_backward).
            torch.autograd.Variable._execution_engine.run_backward(
                tuple(o for o, _ in pairs), tuple(g for _, g in pairs), False, False, (), True, True
            )
        if not self.is_first_stage:
            inputs = _as_tuple(self.buffers["inputs"][buffer_id])
            self.buffers["input_grads"][buffer_id] = tuple(
                (i.grad if i.grad is not None else torch.zeros_like(i)) for i in inputs if i.requires_grad
            )
        self.buffers["outputs"][buffer_id] = None
        self.buffers["output_grads"][buffer_id] = None

    def _exec_send_activations(self, buffer_id: int) -> None:
        outputs = _as_tuple(self.buffers["outputs"][buffer_id])
        if self._meta_sent is None:
            self.p2p.send_meta(outputs, self.next_rank)
            self._meta_sent = [(t.dtype, t.requires_grad, tuple(t.shape)) for t in outputs]
        self._pending.append((self.p2p.isend(outputs, self.next_rank), outputs, torch.is_grad_enabled()))

    def _recv(self, kind: str, meta, src: int) -> tuple:
        posted = self._posted[kind]
        if posted is None:
            bufs = self.p2p.buffers(meta)
            self.p2p.recv_into(bufs, src)
        else:
            bufs, works = posted
            for w in works:
                w.wait()
        self._recvd[kind] += 1
        more = self._recvd[kind] < self._sched_micro_batches
        self._posted[kind] = self.p2p.irecv(meta, src) if more else None
        return bufs

    def _exec_recv_activations(self, buffer_id: int) -> None:
        if self._meta_received is None:
            self._meta_received = self.p2p.recv_meta(self.prev_rank)
        bufs = self._recv("act", self._meta_received, self.prev_rank)
        for t, (dtype, grad, _) in zip(bufs, self._meta_received):
            t.requires_grad_(grad and dtype.is_floating_point and torch.is_grad_enabled())
        self.buffers["inputs"][buffer_id] = bufs[0] if len(bufs) == 1 else bufs

    def _exec_send_grads(self, buffer_id: int) -> None:
        grads = self.buffers["input_grads"][buffer_id]
        self._pending.append((self.p2p.isend(grads, self.prev_rank), grads, False))
        self.buffers["inputs"][buffer_id] = None
        self.buffers["input_grads"][buffer_id] = None

    def _exec_recv_grads(self, buffer_id: int) -> None:
        meta = [(dtype, True, shape) for dtype, grad, shape in self._meta_sent if grad]
        bufs = self._recv("grad", meta, self.next_rank)
        self.buffers["output_grads"][buffer_id] = bufs

    def _exec_reduce_tied_grads(self) -> None:
        self.module.allreduce_tied_weight_gradients()

    def _exec_reduce_grads(self) -> None:
        self.optimizer.post_backward(True)

    def _exec_optimizer_step(self) -> None:
        took = self.optimizer.step()
        self._stepped, self._step_applied = True, bool(took)
        if took:
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        else:
            self.skipped_steps += 1
        self.global_steps += 1
        self.global_samples += self._config.train_batch_size
        self.micro_steps += self.micro_batches

    _INSTRUCTION_MAP = {
        schedule.OptimizerStep: "_exec_optimizer_step",
        schedule.ReduceGrads: "_exec_reduce_grads",
        schedule.ReduceTiedGrads: "_exec_reduce_tied_grads",
        schedule.LoadMicroBatch: "_exec_load_micro_batch",
        schedule.ForwardPass: "_exec_forward_pass",
        schedule.BackwardPass: "_exec_backward_pass",
        schedule.SendActivation: "_exec_send_activations",
        schedule.RecvActivation: "_exec_recv_activations",
        schedule.SendGrad: "_exec_send_grads",
        schedule.RecvGrad: "_exec_recv_grads",
    }

    def _aggregate_total_loss(self, reduce: str = "avg", bcast: bool = True) -> torch.Tensor:
        """The last stage's mean micro-batch loss, averaged over data parallelism, given to every stage."""
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.is_last_stage and self._losses:
            loss = torch.stack(self._losses).mean() if reduce == "avg" else torch.stack(self._losses).sum()
            if self.dp_world_size > 1:
                dist.all_reduce(loss, group=self.dp_process_group)
                loss /= self.dp_world_size
        if bcast and self.num_stages > 1:
            dist.broadcast(
                loss, src=self.grid.stage_to_global(self.num_stages - 1), group=self.grid.get_pipe_parallel_group()
            )
        return loss
