"""``GPTModel``: embedding -> transformer block (built from a layer spec) -> vocab-parallel output layer
(``megatron/core/models/gpt/gpt_model.py``), a ``LanguageModule`` (the loss, the weight tying and the checkpoint
entries are there).

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

from mega_par import parallel_state as ps
from mega_par.models.common.embeddings.language_model_embedding import LanguageModelEmbedding, seeded
from mega_par.models.common.language_module.language_module import LanguageModule
from mega_par.tensor_parallel.layers import ColumnParallelLinear
from mega_par.tensor_parallel.mappings import gather_from_tensor_model_parallel_region
from mega_par.transformer.attention import RotaryEmbedding
from mega_par.transformer.transformer_block import TransformerBlock

_POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none")


class GPTModel(LanguageModule):
    def __init__(self, config, transformer_layer_spec, vocab_size: int, max_sequence_length: int,
                 pre_process: bool = True, post_process: bool = True, fp16_lm_cross_entropy: bool = False,
                 parallel_output: bool = True, share_embeddings_and_output_weights: bool = False,
                 position_embedding_type: str = "learned_absolute", rotary_percent: float = 1.0,
                 rotary_base: int = 10000, rope_scaling: bool = False, scatter_embedding_sequence_parallel: bool = True,
                 seq_len_interpolation_factor: float | None = None, mtp_block_spec=None, pg_collection=None,
                 vp_stage: int | None = None, *, seed: int | None = None):
        """Megatron's signature; ``seed`` (mega_par's, keyword-only) fixes every module's initial weights
        independently of the layout (None: one draw from the default generator, identical on all ranks)."""
        if position_embedding_type not in _POSITION_EMBEDDING_TYPES:
            raise ValueError(f"position_embedding_type must be one of {_POSITION_EMBEDDING_TYPES}, "
                             f"got {position_embedding_type!r}")
        for name, value, default in (("rotary_percent", rotary_percent, 1.0), ("rope_scaling", rope_scaling, False),
                                     ("seq_len_interpolation_factor", seq_len_interpolation_factor, None),
                                     ("mtp_block_spec", mtp_block_spec, None)):
            if value != default:
                raise ValueError(f"GPTModel: {name}={value!r} is not supported by mega_par (only {default!r})")
        if ps.get_context_parallel_world_size() != 1:
            raise ValueError("GPTModel supports context_parallel_size=1 only "
                             f"(got {ps.get_context_parallel_world_size()})")
        if vocab_size % ps.get_tensor_model_parallel_world_size():
            raise ValueError(f"vocab_size ({vocab_size}) must be divisible by the tensor-parallel size "
                             f"({ps.get_tensor_model_parallel_world_size()}); pad the vocabulary")
        if pg_collection is not None:  # the layers communicate over parallel_state's groups
            for name, group in (("tp", ps.get_tensor_model_parallel_group()), ("cp", ps.get_context_parallel_group()),
                                ("pp", ps.get_pipeline_model_parallel_group())):
                if getattr(pg_collection, name, None) is not group:
                    raise ValueError(f"GPTModel: pg_collection.{name} is not parallel_state's {name} group; mega_par's "
                                     "layers communicate over parallel_state's groups only")
        super().__init__(config=config, pg_collection=pg_collection)
        self.transformer_layer_spec = transformer_layer_spec
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
        self.rotary_pos_emb = RotaryEmbedding(config.kv_channels, rotary_base=rotary_base) \
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
        if pre_process or post_process:
            self.setup_embeddings_and_output_layer()

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, (list, tuple)):
            input_tensor = input_tensor[0]
        self.decoder.set_input_tensor(input_tensor)

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
        if not self.fp16_lm_cross_entropy:
            logits = logits.float()  # the loss in fp32 (Megatron's fp16_lm_cross_entropy=False)
        return self.compute_language_model_loss(labels, logits)

    def _full_seq_len(self, decoder_input, input_ids) -> int:
        if decoder_input is None:
            decoder_input = self.decoder.input_tensor
        if decoder_input is None:
            return input_ids.shape[1]
        s = decoder_input.shape[0]
        return s * ps.get_tensor_model_parallel_world_size() if self.config.sequence_parallel else s
