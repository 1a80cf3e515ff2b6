"""``GPTModel``: embedding -> transformer block (built from a layer spec) -> vocab-parallel output layer
(``megatron/core/models/gpt/gpt_model.py``).

``pre_process`` (first stage) owns the embedding, ``post_process`` (last stage) the final norm, output layer
and loss; middle stages receive activations via ``set_input_tensor``. ``share_embeddings_and_output_weights``
ties the output layer to the word embedding: on one stage they are one parameter; across stages the last
stage holds its own copy, initialised identically, and the pipeline's embedding group all-reduces the two
copies' gradients (``finalize_model_grads``) so they stay equal.

Activations flow as ``[sequence, batch, hidden]`` (sequence-sharded with SP); parameter initialisation is
seeded per module (embedding, each layer, output layer) so any TP/PP layout holds the same full model.
"""

from __future__ import annotations

import torch
from torch import nn

from mega_par import parallel_state as ps
from mega_par.models.common.embeddings.language_model_embedding import LanguageModelEmbedding, seeded
from mega_par.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from mega_par.tensor_parallel.layers import ColumnParallelLinear
from mega_par.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from mega_par.transformer.attention import RotaryEmbedding
from mega_par.transformer.transformer_block import TransformerBlock
from mega_par.transformer.utils import (
    make_sharded_tensors_for_checkpoint,
    make_tp_sharded_tensor_for_checkpoint,
    replace_prefix_for_sharding,
    tp_axis_map,
)

_POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none")


class GPTModel(nn.Module):
    def __init__(self, config, transformer_layer_spec, vocab_size: int, max_sequence_length: int,
                 pre_process: bool = True, post_process: bool = True, fp16_lm_cross_entropy: bool = False,
                 parallel_output: bool = True, share_embeddings_and_output_weights: bool = False,
                 position_embedding_type: str = "learned_absolute", rotary_percent: float = 1.0,
                 rotary_base: int = 10000, rope_scaling: bool = False, scatter_embedding_sequence_parallel: bool = True,
                 seq_len_interpolation_factor: float | None = None, mtp_block_spec=None, pg_collection=None,
                 vp_stage: int | None = None, *, seed: int | None = None):
        """Megatron's signature; ``seed`` (mega_par's, keyword-only) fixes every module's initial weights
        independently of the layout (None: one draw from the default generator, identical on all ranks)."""
        super().__init__()
        if position_embedding_type not in _POSITION_EMBEDDING_TYPES:
            raise ValueError(f"position_embedding_type must be one of {_POSITION_EMBEDDING_TYPES}, "
                             f"got {position_embedding_type!r}")
        for name, value, default in (("rotary_percent", rotary_percent, 1.0), ("rope_scaling", rope_scaling, False),
                                     ("seq_len_interpolation_factor", seq_len_interpolation_factor, None),
                                     ("mtp_block_spec", mtp_block_spec, None), ("pg_collection", pg_collection, None)):
            if value != default:
                raise ValueError(f"GPTModel: {name}={value!r} is not supported by mega_par (only {default!r})")
        if ps.get_context_parallel_world_size() != 1:
            raise ValueError("GPTModel supports context_parallel_size=1 only "
                             f"(got {ps.get_context_parallel_world_size()})")
        if vocab_size % ps.get_tensor_model_parallel_world_size():
            raise ValueError(f"vocab_size ({vocab_size}) must be divisible by the tensor-parallel size "
                             f"({ps.get_tensor_model_parallel_world_size()}); pad the vocabulary")
        self.config, self.transformer_layer_spec = config, transformer_layer_spec
        self.vocab_size, self.max_sequence_length = vocab_size, max_sequence_length
        self.pre_process, self.post_process, self.parallel_output = pre_process, post_process, parallel_output
        self.fp16_lm_cross_entropy = fp16_lm_cross_entropy
        self.share_embeddings_and_output_weights = share_embeddings_and_output_weights
        self.position_embedding_type, self.vp_stage = position_embedding_type, vp_stage
        if seed is None:  # one draw from the (TP/PP-identical) default generator fixes every module's seed
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        self.seed = seed
        emb_seed, out_seed = seed, seed + 2 * config.num_layers + 7
        if pre_process:
            self.embedding = LanguageModelEmbedding(config, vocab_size, max_sequence_length, position_embedding_type,
                                                    scatter_to_sequence_parallel=scatter_embedding_sequence_parallel,
                                                    seed=emb_seed)
        self.rotary_pos_emb = RotaryEmbedding(config.kv_channels, rotary_base) \
            if position_embedding_type == "rope" else None
        self.decoder = TransformerBlock(config, transformer_layer_spec, pre_process=pre_process,
                                        post_process=post_process, vp_stage=vp_stage, layer_seed=seed + 10)
        if post_process:
            tied_here = share_embeddings_and_output_weights and pre_process
            # an untied output layer has its own seed; a tied copy on the last stage the embedding's
            with seeded(emb_seed if share_embeddings_and_output_weights else out_seed):
                self.output_layer = ColumnParallelLinear(config.hidden_size, vocab_size, config=config,
                                                         init_method=config.init_method, bias=False,
                                                         gather_output=False,
                                                         skip_weight_param_allocation=tied_here)
        if share_embeddings_and_output_weights:
            self.setup_embeddings_and_output_layer()

    def setup_embeddings_and_output_layer(self) -> None:
        """Tie the output layer to the word embedding (Megatron's ``LanguageModule`` method). On one stage the
        output layer has no weight of its own; across stages the last stage's copy is zeroed and summed with
        the first stage's over the embedding group, so it starts equal whatever the seeds."""
        weight = self.shared_embedding_or_output_weight()
        if weight is None:
            return
        weight.shared_embedding = True
        if self.pre_process and self.post_process:
            return
        if ps.get_pipeline_model_parallel_world_size() == 1 or not ps.is_rank_in_embedding_group(ignore_virtual=True):
            raise ValueError("GPTModel: share_embeddings_and_output_weights with pre_process="
                             f"{self.pre_process}, post_process={self.post_process} needs this rank in the "
                             "pipeline's embedding group (first or last stage)")
        with torch.no_grad():
            if not self.pre_process:
                weight.zero_()
            torch.distributed.all_reduce(weight, group=ps.get_embedding_group())

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, (list, tuple)):
            input_tensor = input_tensor[0]
        self.decoder.set_input_tensor(input_tensor)

    def shared_embedding_or_output_weight(self):
        if self.pre_process:
            return self.embedding.word_embeddings.weight
        if self.post_process:
            return self.output_layer.weight
        return None

    def forward(self, input_ids, position_ids, attention_mask, decoder_input=None, labels=None,
                inference_context=None, packed_seq_params=None, extra_block_kwargs=None,
                runtime_gather_output: bool | None = None, *, loss_mask=None):
        """Megatron's forward: the hidden state ``[s, b, h]`` on non-last stages; on the last stage the
        per-token loss ``[b, s]`` when ``labels`` is given (``compute_language_model_loss``), else logits
        ``[b, s, vocab/tp]`` (full vocab if not ``parallel_output`` or with ``runtime_gather_output``).
        ``attention_mask``: None (the layer spec's causal mask) or boolean, True = masked out, ``[b, 1, s, s]``."""
        for name, value in (("inference_context", inference_context), ("packed_seq_params", packed_seq_params),
                            ("extra_block_kwargs", extra_block_kwargs)):
            if value:
                raise ValueError(f"GPTModel.forward: {name} is not supported by mega_par")
        if decoder_input is not None:
            pass
        elif self.pre_process:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            decoder_input = self.embedding(input_ids=input_ids, position_ids=position_ids)
        rotary = None
        if self.rotary_pos_emb is not None:
            rotary = self.rotary_pos_emb(self._full_seq_len(decoder_input, input_ids))
        hidden = self.decoder(hidden_states=decoder_input, attention_mask=attention_mask, rotary_pos_emb=rotary)
        if not self.post_process:
            return hidden
        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        logits, _ = self.output_layer(hidden, weight=weight)  # [s, b, V/tp]
        if labels is None:
            gather = (not self.parallel_output) if runtime_gather_output is None else runtime_gather_output
            if gather:
                logits = gather_from_tensor_model_parallel_region(logits)
            return logits.transpose(0, 1).contiguous()
        return self.compute_language_model_loss(labels, logits)

    def compute_language_model_loss(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """labels ``[b, s]``, logits ``[s, b, V/tp]`` -> per-token cross-entropy ``[b, s]`` (Megatron's
        ``LanguageModule.compute_language_model_loss``; float32 logits unless ``fp16_lm_cross_entropy``)."""
        if not self.fp16_lm_cross_entropy:
            logits = logits.float()
        loss = vocab_parallel_cross_entropy(logits, labels.transpose(0, 1).contiguous())
        return loss.transpose(0, 1).contiguous()

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None) -> dict:
        """``{state-dict key: ShardedTensor}`` for ``dist_checkpointing`` (Megatron's
        ``TransformerBlock`` / ``LanguageModule.sharded_state_dict``): layer ``i`` is saved under
        ``decoder.layers.<name>`` at index ``layer_number - 1`` of a prepended ``num_layers`` axis, so any PP
        split finds its layers; TP-split weights are chunks along their partition dim. A tied output weight on
        the last stage is a replica of the first stage's ``embedding.word_embeddings.weight``."""
        if sharded_offsets:
            raise ValueError(f"GPTModel.sharded_state_dict: unexpected sharded_offsets {sharded_offsets}")
        layers_prefix, out = f"{prefix}decoder.layers.", {}
        for i, layer in enumerate(self.decoder.layers):
            sub = make_sharded_tensors_for_checkpoint(layer.state_dict(keep_vars=True), f"{layers_prefix}{i}.",
                                                      tp_axis_map(layer),
                                                      ((0, layer.layer_number - 1, self.config.num_layers),))
            replace_prefix_for_sharding(sub, f"{layers_prefix}{i}.", layers_prefix)
            out.update(sub)
        rest = {k: v for k, v in self.state_dict(keep_vars=True).items() if not k.startswith("decoder.layers.")}
        axes = {k: v for k, v in tp_axis_map(self).items() if not k.startswith("decoder.layers.")}
        out.update(make_sharded_tensors_for_checkpoint(rest, prefix, axes))
        if self.share_embeddings_and_output_weights and self.post_process and not self.pre_process:
            out[f"{prefix}output_layer.weight"] = make_tp_sharded_tensor_for_checkpoint(
                self.output_layer.weight, f"{prefix}embedding.word_embeddings.weight",
                replica_id=(1, 0, ps.get_data_parallel_rank()), allow_shape_mismatch=True)
        return out

    def _full_seq_len(self, decoder_input, input_ids) -> int:
        if decoder_input is None:
            decoder_input = self.decoder.input_tensor
        if decoder_input is None:
            return input_ids.shape[1]
        s = decoder_input.shape[0]
        return s * ps.get_tensor_model_parallel_world_size() if self.config.sequence_parallel else s
