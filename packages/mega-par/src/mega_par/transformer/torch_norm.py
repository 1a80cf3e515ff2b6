"""The local spec's norm: ``torch.nn.LayerNorm`` or ``RMSNorm`` by ``config.normalization``
(``megatron/core/transformer/torch_norm.py``, ``WrappedTorchNorm``).

Megatron's ``WrappedTorchNorm`` refuses ``sequence_parallel`` (apex's ``FusedLayerNorm`` is its SP-aware norm);
here the norm serves both: with SP its weights see only this rank's tokens, so they are marked
``sequence_parallel`` and ``finalize_model_grads`` all-reduces their gradients over the TP group.
"""

from __future__ import annotations

from torch import nn


class WrappedTorchNorm:
    """``WrappedTorchNorm(config, hidden_size, eps)`` returns an ``nn.LayerNorm`` / ``nn.RMSNorm``."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                zero_centered_gamma: bool = False, normalization: str = "LayerNorm"):
        if config.layernorm_zero_centered_gamma or zero_centered_gamma:
            raise ValueError("WrappedTorchNorm: zero_centered_gamma is not supported by torch LayerNorm")
        if config.normalization == "LayerNorm":
            norm_cls = nn.LayerNorm
        elif config.normalization == "RMSNorm":
            norm_cls = nn.RMSNorm
        else:
            raise ValueError(f"WrappedTorchNorm supports normalization 'LayerNorm' or 'RMSNorm', "
                             f"got {config.normalization!r}")
        norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm
