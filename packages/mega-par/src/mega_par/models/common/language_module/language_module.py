"""``LanguageModule`` (``megatron/core/models/common/language_module/language_module.py``): what GPT-style models
share: the tensor-parallel group, and the per-token loss over vocab-parallel logits."""

from __future__ import annotations

from torch import Tensor

from mega_par import parallel_state, tensor_parallel
from mega_par.transformer.module import MegatronModule


class LanguageModule(MegatronModule):
    def __init__(self, config, pg_collection=None) -> None:
        """``pg_collection``: an object with a ``tp`` group (Megatron's ``ProcessGroupCollection``); default
        parallel_state's groups."""
        super().__init__(config=config)
        tp = getattr(pg_collection, "tp", None)
        self.tp_group = tp if tp is not None else parallel_state.get_tensor_model_parallel_group()

    def compute_language_model_loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """labels ``[b, s]``, logits ``[s, b, V/tp]`` -> per-token cross-entropy ``[b, s]``. With
        ``cross_entropy_loss_fusion`` Megatron runs a fused kernel for the same loss; here the same function."""
        labels = labels.transpose(0, 1).contiguous()  # [b s] => [s b]
        loss = tensor_parallel.vocab_parallel_cross_entropy(logits, labels, tp_group=self.tp_group)
        return loss.transpose(0, 1).contiguous()  # [s b] => [b s]
