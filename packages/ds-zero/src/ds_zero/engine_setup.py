"""What ``DeepSpeedEngine.__init__`` decides before training starts: which torch optimizer a config names
(DeepSpeed's ``_configure_basic_optimizer``) and whether the NVMe swap directory can hold the states.
"""

from __future__ import annotations

import logging
import os

import torch

from ds_zero.ops.adam.cpu_adam import DeepSpeedCPUAdam
from ds_zero.runtime.zero.config import check_nvme_path

logger = logging.getLogger(__name__)


def build_basic_optimizer(name: str, params: dict, model_parameters, offload: bool = False) -> torch.optim.Optimizer:
    kwargs = dict(params)
    if name in ("Adam", "AdamW"):
        torch_adam = kwargs.pop("torch_adam", False)
        adam_w_mode = kwargs.pop("adam_w_mode", True)
        bias_correction = kwargs.pop("bias_correction", True)
        if "betas" in kwargs:
            kwargs["betas"] = tuple(kwargs["betas"])
        # As in DeepSpeed: type "Adam" means decoupled weight decay unless adam_w_mode is false.
        adamw = name == "AdamW" or adam_w_mode
        if offload and not torch_adam:
            # ZeRO-Offload steps on the CPU: DeepSpeed swaps in its CPU Adam there, so do we.
            return DeepSpeedCPUAdam(model_parameters, adamw_mode=adamw, bias_correction=bias_correction, **kwargs)
        if not bias_correction:
            raise ValueError("optimizer.params.bias_correction=false needs DeepSpeedCPUAdam (offload_optimizer); "
                             "torch's Adam always corrects bias")
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        return cls(model_parameters, **kwargs)
    return torch.optim.SGD(model_parameters, **kwargs)


def nvme_bytes_per_rank(cfg, model_parameters, dp_world_size: int) -> dict[str, int]:
    """Bytes each rank swaps to ``nvme_path``: fp32 master + two Adam moments; low-precision params."""
    # zero.Init-built params are empty; ds_numel is their real size.
    params = [q for p in model_parameters for q in (p["params"] if isinstance(p, dict) else [p])]
    numel = sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad)
    per_rank = -(-numel // dp_world_size)
    param_bytes = 2 if (cfg.fp16.enabled or cfg.bf16_enabled) else 4
    out = {}
    if cfg.zero.offload_optimizer.device == "nvme":
        out["offload_optimizer"] = 12 * per_rank
    if cfg.zero.offload_param.device == "nvme":
        out["offload_param"] = param_bytes * per_rank
    return out


def check_nvme_space(cfg, model_parameters, dp_world_size: int) -> None:
    """A full disk is an error now, before any rank communicates, not at the first swap-out."""
    need = nvme_bytes_per_rank(cfg, model_parameters, dp_world_size)
    for key, nbytes in need.items():
        path = getattr(cfg.zero, key).nvme_path
        # Ranks on one machine share the disk: ask for room for all of them (with 10% for alignment).
        local = int(os.environ.get("LOCAL_WORLD_SIZE", dp_world_size))
        check_nvme_path(f"zero_optimization.{key}.nvme_path", path, int(nbytes * min(local, dp_world_size) * 1.1))
