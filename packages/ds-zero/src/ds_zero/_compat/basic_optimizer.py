"""The torch optimizer a DeepSpeed config's ``optimizer`` section names (DeepSpeed's
``DeepSpeedEngine._configure_basic_optimizer``); the engine wraps it in the ZeRO optimizer of its stage."""

from __future__ import annotations

import torch

from ds_zero.ops.adam.cpu_adam import DeepSpeedCPUAdam


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


def client_optimizer(optimizer, model_parameters) -> torch.optim.Optimizer:
    """``initialize(optimizer=...)``: a torch optimizer, or a callable that builds one from the parameters."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        return optimizer(model_parameters)
    raise TypeError(f"optimizer must be a torch.optim.Optimizer or a callable, got {type(optimizer).__name__}")
