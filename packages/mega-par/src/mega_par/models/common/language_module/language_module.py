"""``LanguageModule`` (``megatron/core/models/common/language_module/language_module.py``): what GPT-style models
share: their process groups, the per-token loss over vocab-parallel logits, and the word embedding tied to the
output layer (one parameter on one stage; across stages a copy on the last stage, kept equal over the embedding
group, and saved as a replica of the first stage's)."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from mega_par import parallel_state, tensor_parallel
from mega_par.transformer.module import MegatronModule
from mega_par.transformer.utils import make_tp_sharded_tensor_for_checkpoint

logger = logging.getLogger(__name__)


class LanguageModule(MegatronModule):
    def __init__(self, config, pg_collection=None) -> None:
        """``pg_collection``: an object with ``tp``, ``pp``, ``cp`` and ``embd`` groups (Megatron's
        ``ProcessGroupCollection``); None: parallel_state's."""
        super().__init__(config=config)
        ps = parallel_state
        if pg_collection is None:
            self.tp_group, self.pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
            self.cp_group, self.embd_group = ps.get_context_parallel_group(), ps.get_embedding_group()
        else:
            missing = [g for g in ("tp", "pp", "cp", "embd") if not hasattr(pg_collection, g)]
            if missing:
                raise ValueError(f"LanguageModule: pg_collection lacks the groups {missing} (embd may be None)")
            self.tp_group, self.pp_group = pg_collection.tp, pg_collection.pp
            self.cp_group, self.embd_group = pg_collection.cp, pg_collection.embd
        self.pg_collection = pg_collection
        self.vp_stage = None
        self.vp_size = getattr(config, "virtual_pipeline_model_parallel_size", None)

    def compute_language_model_loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """labels ``[b, s]``, logits ``[s, b, V/tp]`` -> per-token cross-entropy ``[b, s]``. With
        ``cross_entropy_loss_fusion`` Megatron's native fused kernel computes the same loss: here the same function;
        its Transformer Engine kernel is refused by name."""
        if getattr(self.config, "cross_entropy_loss_fusion", False) \
                and getattr(self.config, "cross_entropy_fusion_impl", "native") == "te":
            raise NotImplementedError("cross_entropy_fusion_impl='te' needs Transformer Engine's parallel cross "
                                      "entropy, which mega_par does not have (use 'native')")
        labels = labels.transpose(0, 1).contiguous()  # [b s] => [s b]
        loss = tensor_parallel.vocab_parallel_cross_entropy(logits, labels, tp_group=self.tp_group)
        return loss.transpose(0, 1).contiguous()  # [s b] => [b s]

    def shared_embedding_or_output_weight(self) -> Tensor | None:
        """The first stage's word embedding weight, the last stage's output weight, None on middle stages."""
        if self.pre_process:
            return self.embedding.word_embeddings.weight
        if self.post_process:
            return self.output_layer.weight
        return None

    def setup_embeddings_and_output_layer(self) -> None:
        """Mark the embedding and output weights (``is_embedding_or_output_parameter``), and tie them when
        ``share_embeddings_and_output_weights``: on one stage they are one parameter; across stages the last
        stage's copy is zeroed and summed with the first stage's over the embedding group, so it starts equal."""
        if self.pre_process and hasattr(self, "embedding"):
            self.embedding.word_embeddings.weight.is_embedding_or_output_parameter = True
        output = getattr(self, "output_layer", None) if self.post_process else None
        if output is not None and output.weight is not None:
            output.weight.is_embedding_or_output_parameter = True
        if not self.share_embeddings_and_output_weights:
            return
        weight = self.shared_embedding_or_output_weight()
        if weight is None:
            return
        weight.shared_embedding = True
        if self.pre_process and self.post_process:
            return
        if not torch.distributed.is_initialized():
            logger.warning("Distributed processes aren't initialized, so the output layer is not initialized with "
                           "weights from the word embeddings; this needs to be handled manually")
            return
        if parallel_state.get_pipeline_model_parallel_world_size() == 1 or not self._is_in_embd_group():
            raise ValueError("share_embeddings_and_output_weights with pre_process="
                             f"{self.pre_process}, post_process={self.post_process} needs this rank in the "
                             "pipeline's embedding group (first or last stage)")
        with torch.no_grad():
            if not self.pre_process:
                weight.zero_()
                weight.shared = True
            torch.distributed.all_reduce(weight, group=self.embd_group)

    def _is_in_embd_group(self) -> bool:
        if self.embd_group is None:
            return False
        return torch.distributed.get_rank() in torch.distributed.get_process_group_ranks(self.embd_group)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """``MegatronModule``'s, with a tied output weight on the last stage saved as a replica of the first
        stage's ``embedding.word_embeddings.weight``."""
        if sharded_offsets:
            raise ValueError(f"{type(self).__name__}.sharded_state_dict: unexpected sharded_offsets {sharded_offsets}")
        out = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        emb_key, out_key = f"{prefix}embedding.word_embeddings.weight", f"{prefix}output_layer.weight"
        if self.share_embeddings_and_output_weights:
            self.tie_embeddings_and_output_weights_state_dict(out, out_key, emb_key, metadata or {})
        elif self.post_process:
            out[out_key].allow_shape_mismatch = True
        return out

    def tie_embeddings_and_output_weights_state_dict(self, sharded_state_dict: dict, output_layer_weight_key: str,
                                                     first_stage_word_emb_key: str, metadata: dict = {}) -> None:  # noqa: B006 - Megatron's signature
        """In place: on a last stage without the embedding, the output weight becomes a non-main replica of the
        first stage's word embedding (replica id ``(1, 0, dp_rank)``)."""
        if not self.post_process:
            if output_layer_weight_key in sharded_state_dict:
                raise ValueError(f"{output_layer_weight_key} present on a stage without the output layer")
            return
        if self.pre_process:
            return  # the output layer uses the embedding's weight itself
        del sharded_state_dict[output_layer_weight_key]
        sharded_state_dict[output_layer_weight_key] = make_tp_sharded_tensor_for_checkpoint(
            self.shared_embedding_or_output_weight(), first_stage_word_emb_key,
            replica_id=(1, 0, parallel_state.get_data_parallel_rank(with_context_parallel=True)),
            allow_shape_mismatch=True)
