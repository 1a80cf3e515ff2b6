"""Pipeline schedules as instruction streams (DeepSpeed's ``deepspeed/runtime/pipe/schedule.py``).

A schedule yields, per time slot ("tick"), the instructions one stage executes. With unit-time forward and
backward passes, synchronous 1F1B (Narayanan et al., "PipeDream-Flush", 2021; Megatron-LM's schedule) has
closed forms: stage s of p runs the forward of micro-batch j at tick ``2j + s`` and its backward at tick
``2j + 2p - 1 - s``, so forwards and backwards of a stage never share a tick (opposite parities), at most
``p - s`` micro-batches are in flight on stage s, and each stage is busy ``2m`` of ``2(m + p - 1)`` ticks:
the bubble is ``(p - 1) / (m + p - 1)``. A result is sent at the start of the next tick, when the
neighbour's tick receives it, so each send meets its receive.
"""

from __future__ import annotations


class PipeInstruction:
    def __init__(self, **kwargs):
        self.name = self.__class__.__name__
        self.kwargs = kwargs
        for key, val in kwargs.items():
            setattr(self, key, val)

    def __repr__(self):
        args = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{self.name}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.kwargs == other.kwargs


class OptimizerStep(PipeInstruction):
    """Step the optimizer (after the batch's gradients are reduced)."""


class ReduceGrads(PipeInstruction):
    """Reduce gradients over data parallelism (the ZeRO optimizer's reduction)."""


class ReduceTiedGrads(PipeInstruction):
    """All-reduce tied weights' gradients between the stages that hold copies."""


class BufferOpInstruction(PipeInstruction):
    def __init__(self, buffer_id: int, **kwargs):
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    """Read the next micro-batch: inputs on the first stage, labels on the last."""


class ForwardPass(BufferOpInstruction):
    pass


class BackwardPass(BufferOpInstruction):
    pass


class SendActivation(BufferOpInstruction):
    pass


class RecvActivation(BufferOpInstruction):
    pass


class SendGrad(BufferOpInstruction):
    pass


class RecvGrad(BufferOpInstruction):
    pass


class PipeSchedule:
    def __init__(self, micro_batches: int, stages: int, stage_id: int):
        if micro_batches < 1 or stages < 1 or not 0 <= stage_id < stages:
            raise ValueError(f"bad schedule: micro_batches={micro_batches}, stages={stages}, stage_id={stage_id}")
        self.micro_batches = micro_batches
        self.stages = stages
        self.stage_id = stage_id
        self.prev_stage = stage_id - 1
        self.next_stage = stage_id + 1

    def steps(self):
        raise NotImplementedError

    def num_pipe_buffers(self) -> int:
        return self.micro_batches

    def _valid_micro_batch(self, micro_batch_id: int | None) -> bool:
        return micro_batch_id is not None and 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id: int) -> bool:
        return 0 <= stage_id < self.stages

    @property
    def stage(self) -> int:
        return self.stage_id

    @property
    def num_stages(self) -> int:
        return self.stages

    @property
    def num_micro_batches(self) -> int:
        return self.micro_batches

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.stages - 1

    def _buffer_idx(self, micro_batch_id: int) -> int:
        return micro_batch_id % self.num_pipe_buffers()

    def __iter__(self):
        return iter(self.steps())

    def compute_at(self, tick: int):
        """``(micro_batch, is_forward)`` this stage computes at ``tick`` (micro_batch None when idle)."""
        raise NotImplementedError

    def num_ticks(self) -> int:
        raise NotImplementedError

    def _train_steps(self):
        """Per tick: the previous tick's result is sent first, then this tick's input received, then compute."""
        prev = (None, None)
        for tick in range(self.num_ticks()):
            mb, fwd = self.compute_at(tick)
            cmds = []
            prev_mb, prev_fwd = prev
            valid, prev_valid = self._valid_micro_batch(mb), self._valid_micro_batch(prev_mb)
            if prev_valid and prev_fwd is False and self._valid_stage(self.prev_stage):
                cmds.append(SendGrad(self._buffer_idx(prev_mb)))
            if valid and fwd and self._valid_stage(self.prev_stage):
                cmds.append(RecvActivation(self._buffer_idx(mb)))
            if valid and fwd is False and self._valid_stage(self.next_stage):
                cmds.append(RecvGrad(self._buffer_idx(mb)))
            if prev_valid and prev_fwd and self._valid_stage(self.next_stage):
                cmds.append(SendActivation(self._buffer_idx(prev_mb)))
            if valid and fwd and (self.is_first_stage or self.is_last_stage):
                cmds.append(LoadMicroBatch(self._buffer_idx(mb)))
            if valid:
                cmds.append((ForwardPass if fwd else BackwardPass)(self._buffer_idx(mb)))
            if tick == self.num_ticks() - 1:
                cmds.extend([ReduceTiedGrads(), ReduceGrads(), OptimizerStep()])
            prev = (mb, fwd)
            yield cmds


class TrainSchedule(PipeSchedule):
    """Synchronous 1F1B: warm-up forwards, steady one-forward-one-backward, cool-down backwards."""

    def num_ticks(self) -> int:
        return 2 * (self.micro_batches + self.stages - 1)

    def compute_at(self, tick: int):
        s, p = self.stage_id, self.stages
        if (tick - s) % 2 == 0:
            return (tick - s) // 2, True  # forward tick: 2j + s
        return (tick - (2 * p - 1 - s)) // 2, False  # backward tick: 2j + 2p - 1 - s

    def steps(self):
        return self._train_steps()

    def num_pipe_buffers(self) -> int:
        """Micro-batches in flight: forwards done minus backwards done peaks at p - s."""
        return max(2, min(self.stages - self.stage_id, self.micro_batches))


class GPipeSchedule(PipeSchedule):
    """All forwards, then all backwards (Huang et al., "GPipe", 2019; torch.distributed.pipelining's ScheduleGPipe):
    the same bubble as 1F1B but every micro-batch's activations are alive at the turn."""

    def num_ticks(self) -> int:
        return 2 * (self.micro_batches + self.stages - 1)

    def compute_at(self, tick: int):
        s, p, m = self.stage_id, self.stages, self.micro_batches
        if tick < m + p - 1:
            return tick - s, True
        return tick - (m + p - 1) - (p - 1 - s), False

    def steps(self):
        return self._train_steps()

    def num_pipe_buffers(self) -> int:
        return self.micro_batches


class InferenceSchedule(PipeSchedule):
    """Forwards only: micro-batch j on stage s at tick j + s; two buffers alternate (one receiving, one sending)."""

    def steps(self):
        for tick in range(self.micro_batches + self.stages - 1):
            mb = tick - self.stage_id
            # Stages of opposite parity use the buffers the other way round, so a send meets a receive.
            recv_buf, send_buf = (tick % 2, (tick + 1) % 2) if self.stage_id % 2 == 0 else ((tick + 1) % 2, tick % 2)
            cmds = []
            if (self.is_first_stage or self.is_last_stage) and self._valid_micro_batch(mb):
                cmds.append(LoadMicroBatch(recv_buf))
            send = self._valid_stage(self.next_stage) and self._valid_micro_batch(mb - 1)
            recv = self._valid_stage(self.prev_stage) and self._valid_micro_batch(mb)
            if self.stage_id % 2 == 0:
                cmds += ([SendActivation(send_buf)] if send else []) + ([RecvActivation(recv_buf)] if recv else [])
            else:
                cmds += ([RecvActivation(recv_buf)] if recv else []) + ([SendActivation(send_buf)] if send else [])
            if self._valid_micro_batch(mb):
                cmds.append(ForwardPass(recv_buf))
            yield cmds

    def num_pipe_buffers(self) -> int:
        return 2

    def compute_at(self, tick: int):
        return tick - self.stage_id, True

    def num_ticks(self) -> int:
        return self.micro_batches + self.stages - 1
