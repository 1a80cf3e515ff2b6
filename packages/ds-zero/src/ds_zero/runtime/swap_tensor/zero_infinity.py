"""ZeRO-Infinity (Rajbhandari et al., "ZeRO-Infinity: Breaking the GPU Memory Wall", 2021): stage 3 with its
optimizer states and/or parameter partitions on NVMe.

The fp32 partition is cut into sub-groups of whole parameters of at most ``sub_group_size`` elements
(DeepSpeed's ``_create_fp16_sub_groups``). The step walks them in order: swap a sub-group's states in
(the next one's read already under way with ``pipeline_read``), step it with ``DeepSpeedCPUAdam``, which
writes the low-precision update into an aligned staging buffer, swap the states out (in the background with
``pipeline_write``) and write the updated parameter partitions to their files when they live on NVMe.
Swap files go under ``nvme_path/ds_zero_swap/rank<R>_<pid>`` and are removed when the engine is destroyed
or the process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil

import torch
import torch.distributed as dist

from ds_zero._infra.aio import AsyncIOHandle, aligned_empty, round_up
from ds_zero.ops.adam.cpu_adam import DeepSpeedCPUAdam
from ds_zero.runtime.config import check_nvme_path
from ds_zero.runtime.swap_tensor.partitioned_optimizer_swapper import PartitionedOptimizerSwapper
from ds_zero.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper


def nvme_bytes_per_rank(cfg, model_parameters, dp_world_size: int) -> dict[str, int]:
    """Bytes each rank swaps to ``nvme_path``: fp32 master + two Adam moments; low-precision params."""
    # zero.Init-built params are empty; ds_numel is their real size.
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in model_parameters if p.requires_grad)
    per_rank = -(-numel // dp_world_size)
    param_bytes = 2 if (cfg.fp16.enabled or cfg.bf16_enabled) else 4
    out = {}
    if cfg.zero.offload_optimizer.device == "nvme":
        out["offload_optimizer"] = 12 * per_rank
    if cfg.zero.offload_param.device == "nvme":
        out["offload_param"] = param_bytes * per_rank
    return out


def check_nvme_space(cfg, model_parameters, dp_world_size: int) -> None:
    """Room on ``nvme_path`` for every local rank's swap files (with 10% for alignment), or a config error."""
    for key, nbytes in nvme_bytes_per_rank(cfg, model_parameters, dp_world_size).items():
        path = getattr(cfg.zero, key).nvme_path
        local = int(os.environ.get("LOCAL_WORLD_SIZE", dp_world_size))  # ranks on one machine share the disk
        check_nvme_path(f"zero_optimization.{key}.nvme_path", path, int(nbytes * min(local, dp_world_size) * 1.1))


def _folder(root: str, kind: str) -> str:
    return os.path.join(root, "ds_zero_swap", f"rank{dist.get_rank()}_{os.getpid()}", kind)


class ZeroInfinity:
    @staticmethod
    def factory(zero_cfg, aio_cfg):
        return lambda stage3: ZeroInfinity(stage3, zero_cfg, aio_cfg)

    def __init__(self, opt, zero_cfg, aio_cfg):
        self.opt = opt
        off_o, off_p = zero_cfg.offload_optimizer, zero_cfg.offload_param
        if not isinstance(opt.client_optimizer, DeepSpeedCPUAdam):
            raise ValueError("NVMe offload steps with DeepSpeedCPUAdam: use an Adam/AdamW config optimizer without "
                             "torch_adam (or pass a DeepSpeedCPUAdam)")
        self.aio = AsyncIOHandle(aio_cfg.block_size, aio_cfg.queue_depth, aio_cfg.intra_op_parallelism)
        pin = torch.cuda.is_available()
        self.pipeline_read, self.pipeline_write = off_o.pipeline_read, off_o.pipeline_write
        self.sub_groups = self._sub_groups(zero_cfg.sub_group_size)
        self.folders = []
        self.optimizer_swapper = None
        if off_o.device == "nvme":
            folder = _folder(off_o.nvme_path, "optimizer")
            self.folders.append(folder)
            self.optimizer_swapper = PartitionedOptimizerSwapper([hi - lo for _, lo, hi, _ in self.sub_groups],
                                                                 folder, self.aio, off_o.buffer_count, pin)
            for k, (gi, lo, hi, _) in enumerate(self.sub_groups):
                self.optimizer_swapper.write_initial(k, opt.flat_partitions[gi][lo:hi].float(), fast=off_o.fast_init)
            self.optimizer_swapper.drain()
        self.steps = [0] * len(self.sub_groups)
        self.param_swapper = None
        if off_p.device == "nvme":
            params = [p for ps in opt.fp16_groups for p in ps]
            folder = _folder(off_p.nvme_path, "param")
            self.folders.append(folder)
            dtype = opt.flat_partitions[0].dtype if opt.flat_partitions else torch.float32
            self.param_swapper = AsyncPartitionedParameterSwapper(params, folder, self.aio, off_p.buffer_count,
                                                                  off_p.buffer_size, dtype, pin)
            self.staging = aligned_empty(max((self._staged_numel(k) for k in range(len(self.sub_groups))),
                                             default=1), dtype, pin)
            self._write_params_from(lambda gi, lo, hi: opt.flat_partitions[gi][lo:hi])
            for p in params:  # the partitions now live only on disk
                p.ds_tensor = self.param_swapper.placeholder
            opt.flat_partitions = [torch.empty(0, dtype=t.dtype) for t in opt.flat_partitions]
        self._closed = False
        atexit.register(self.close)

    def _sub_groups(self, size: int) -> list[tuple]:
        """``(group, lo, hi, [(param, offset in group)])``: whole params, at most ``size`` elements each."""
        out = []
        for gi, params in enumerate(self.opt.fp16_groups):
            current, lo, off = [], 0, 0
            for p in params:
                c = p.ds_tensor.numel()
                if current and off + c - lo > size:
                    out.append((gi, lo, off, current))
                    current, lo = [], off
                current.append((p, off))
                off += c
            if current:
                out.append((gi, lo, off, current))
        return out

    def _staged_numel(self, k: int) -> int:
        """Sub-group k's params in a staging buffer, each at a 4 KiB-aligned offset (one O_DIRECT write each)."""
        esize = self.param_swapper.esize
        return sum(round_up(p.ds_tensor.numel() * esize) // esize for p, _ in self.sub_groups[k][3])

    def _write_params_from(self, source) -> None:
        """Write every param partition from ``source(group, lo, hi)`` (the low-precision values)."""
        reqs = []
        for gi, _, _, params in self.sub_groups:
            for p, off in params:
                c = self.param_swapper.numel[p.ds_id]
                buf = aligned_empty(c, self.param_swapper.dtype)
                buf.copy_(source(gi, off, off + c))
                reqs.append(self.param_swapper.write(p, buf))
        for r in reqs:
            r.wait()

    def step(self) -> None:
        """Step every sub-group: swap in, DeepSpeedCPUAdam (fused low-precision copy-out), swap out."""
        opt, sw = self.opt, self.optimizer_swapper
        groups = opt.optimizer.param_groups
        if sw is not None and self.pipeline_read and self.sub_groups:
            sw.swap_in(0, async_op=True)
        for k, (gi, lo, hi, _) in enumerate(self.sub_groups):
            self.steps[k] += 1
            grad = opt.fp32_grads[gi][lo:hi]
            if sw is not None:
                i = sw.swap_in(k)
                if self.pipeline_read and k + 1 < len(self.sub_groups):
                    sw.swap_in(k + 1, async_op=True, avoid={i})
                master, exp_avg, exp_avg_sq = sw.views(k, sw.buffers[i])
            else:
                master = opt.master_partitions[gi][lo:hi]
                state = opt.optimizer.init_state(opt.master_partitions[gi])
                exp_avg, exp_avg_sq = state["exp_avg"][lo:hi], state["exp_avg_sq"][lo:hi]
            if self.param_swapper is None:
                target = opt.flat_partitions[gi][lo:hi]
                out = target if target.device.type == "cpu" else torch.empty(hi - lo, dtype=target.dtype)
                opt.client_optimizer.update(master, grad, exp_avg, exp_avg_sq, self.steps[k], groups[gi], out)
                if out is not target:
                    target.copy_(out)
            else:
                self._step_into_param_files(k, master, grad, exp_avg, exp_avg_sq, groups[gi])
            if sw is not None:
                sw.swap_out(k, i, async_op=self.pipeline_write)
        if sw is not None:
            sw.drain()

    def _step_into_param_files(self, k, master, grad, exp_avg, exp_avg_sq, group) -> None:
        """Per param of the sub-group: the fused update rounds into its aligned staging slot, then its file."""
        _, lo, _, params = self.sub_groups[k]
        esize, at, reqs = self.param_swapper.esize, 0, []
        for p, off in params:
            c = self.param_swapper.numel[p.ds_id]
            a, b = off - lo, off - lo + c
            slot = self.staging[at:at + round_up(c * esize) // esize]
            self.opt.client_optimizer.update(master[a:b], grad[a:b], exp_avg[a:b], exp_avg_sq[a:b], self.steps[k],
                                             group, slot[:c])
            reqs.append(self.param_swapper.write(p, slot))
            at += slot.numel()
        # The staging buffer is reused by the next sub-group: its writes must be done first.
        for r in reqs:
            r.wait()

    # --- checkpoints --------------------------------------------------------------------------------------------
    def read_state(self) -> tuple[list[torch.Tensor], list[dict]]:
        """(fp32 masters per group, per sub-group {step, exp_avg, exp_avg_sq}) read back from the files."""
        masters = [torch.zeros(int(sum(hi - lo for g, lo, hi, _ in self.sub_groups if g == gi)))
                   for gi in range(len(self.opt.fp16_groups))]
        states = []
        for k, (gi, lo, hi, _) in enumerate(self.sub_groups):
            if self.optimizer_swapper is not None:
                i = self.optimizer_swapper.swap_in(k)
                m, a, v = (t.clone() for t in self.optimizer_swapper.views(k, self.optimizer_swapper.buffers[i]))
                self.optimizer_swapper.owner[i] = None
            else:
                state = self.opt.optimizer.init_state(self.opt.master_partitions[gi])
                m = self.opt.master_partitions[gi][lo:hi].clone()
                a, v = state["exp_avg"][lo:hi].clone(), state["exp_avg_sq"][lo:hi].clone()
            masters[gi][lo:hi] = m
            states.append({"step": self.steps[k], "exp_avg": a, "exp_avg_sq": v})
        return masters, states

    def write_state(self, masters: list[torch.Tensor], states: list[dict] | None) -> None:
        for k, (gi, lo, hi, _) in enumerate(self.sub_groups):
            st = states[k] if states else None
            if self.optimizer_swapper is not None:
                i = self.optimizer_swapper.swap_in(k)
                m, a, v = self.optimizer_swapper.views(k, self.optimizer_swapper.buffers[i])
                m.copy_(masters[gi][lo:hi])
                if st is not None:
                    a.copy_(st["exp_avg"])
                    v.copy_(st["exp_avg_sq"])
                self.optimizer_swapper.swap_out(k, i)
            else:
                self.opt.master_partitions[gi][lo:hi].copy_(masters[gi][lo:hi])
            if st is not None:
                self.steps[k] = st["step"]
        if self.param_swapper is not None:
            dtype = self.param_swapper.dtype
            self._write_params_from(lambda gi, lo, hi: masters[gi][lo:hi].to(dtype))

    # --- accounting and cleanup ---------------------------------------------------------------------------------
    def host_tensors(self) -> dict:
        out = {}
        if self.optimizer_swapper is not None:
            out["optimizer_states"] = list(self.optimizer_swapper.buffers)
        if self.param_swapper is not None:
            out["parameters"] = list(self.param_swapper.buffers) + [self.staging]
        return out

    def nvme_bytes(self) -> dict:
        out = {}
        if self.optimizer_swapper is not None:
            out["optimizer_states"] = self.optimizer_swapper.file_bytes()
        if self.param_swapper is not None:
            out["parameters"] = self.param_swapper.file_bytes()
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for swapper in (self.optimizer_swapper, self.param_swapper):
            if swapper is not None:
                swapper.close()
        self.aio.close()
        for folder in self.folders:
            shutil.rmtree(os.path.dirname(folder), ignore_errors=True)
