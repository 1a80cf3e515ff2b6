"""OPT (Zhang et al. 2022): a GPT-style decoder with learned positions offset by 2, LayerNorm before (or, in OPT-350m,
after) each block, ReLU MLP, and word embeddings narrower than the model behind ``project_in`` / ``project_out``
(transformers' ``modeling_opt.py``). Built from the core's attention, cache, mask and LM-head pieces."""

from __future__ import annotations

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import prepare_past_key_values
from ...configuration_utils import PretrainedConfig
from ...generation.utils import GenerationMixin
from ...loss_utils import _return_dict, causal_lm_output
from ...masking_utils import create_causal_mask
from ...modeling_layers import GradientCheckpointingLayer, use_cache_under_checkpointing
from ...modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from ...modeling_utils import PreTrainedModel
from .sequence_classification import GenericForSequenceClassification


class OPTConfig(PretrainedConfig):
    model_type = "opt"

    def __init__(self, vocab_size: int = 50272, hidden_size: int = 768, num_hidden_layers: int = 12,
                 ffn_dim: int = 3072, max_position_embeddings: int = 2048, do_layer_norm_before: bool = True,
                 _remove_final_layer_norm: bool = False, word_embed_proj_dim: int | None = None, dropout: float = 0.1,
                 attention_dropout: float = 0.0, num_attention_heads: int = 12, activation_function: str = "relu",
                 layerdrop: float = 0.0, init_std: float = 0.02, use_cache: bool = True, pad_token_id: int | None = 1,
                 bos_token_id: int | None = 2, eos_token_id: int | list[int] | None = 2, enable_bias: bool = True,
                 layer_norm_elementwise_affine: bool = True, tie_word_embeddings: bool = True, **kwargs):
        super().__init__(vocab_size=vocab_size, use_cache=use_cache, pad_token_id=pad_token_id,
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.ffn_dim = ffn_dim
        self.max_position_embeddings = max_position_embeddings
        self.do_layer_norm_before = do_layer_norm_before
        self.remove_final_layer_norm = _remove_final_layer_norm
        self.word_embed_proj_dim = hidden_size if word_embed_proj_dim is None else word_embed_proj_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.num_attention_heads = num_attention_heads
        self.activation_function = activation_function
        self.layerdrop = layerdrop
        self.init_std = init_std
        self.enable_bias = enable_bias
        self.layer_norm_elementwise_affine = layer_norm_elementwise_affine
        if hidden_size % num_attention_heads:
            raise ValueError(f"OPTConfig: hidden_size ({hidden_size}) must be divisible by num_attention_heads "
                             f"({num_attention_heads})")

    def to_dict(self) -> dict:
        out = super().to_dict()  # transformers spells this key with a leading underscore
        out["_remove_final_layer_norm"] = out.pop("remove_final_layer_norm")
        return dict(sorted(out.items()))


class OPTLearnedPositionalEmbedding(nn.Embedding):
    """Position ``p`` is row ``p + 2`` (fairseq kept two rows for its padding scheme)."""

    offset = 2

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__(num_embeddings + self.offset, embedding_dim)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(position_ids + self.offset)


class OPTAttention(nn.Module):
    """Multi-head attention with biased projections; queries are scaled before the product, as in fairseq."""

    def __init__(self, config: OPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        width, bias = config.hidden_size, config.enable_bias
        self.k_proj = nn.Linear(width, width, bias=bias)
        self.v_proj = nn.Linear(width, width, bias=bias)
        self.q_proj = nn.Linear(width, width, bias=bias)
        self.out_proj = nn.Linear(width, width, bias=bias)

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = (self.q_proj(hidden_states) * self.scaling).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        dropout = self.dropout if self.training else 0.0
        out, weights = attention_forward(q, k, v, attention_mask, 1.0, dropout, output_attentions)
        return self.out_proj(out.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)), weights


class OPTDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: OPTConfig, layer_idx: int):
        super().__init__()
        width, affine = config.hidden_size, config.layer_norm_elementwise_affine
        self.self_attn = OPTAttention(config, layer_idx)
        self.do_layer_norm_before = config.do_layer_norm_before
        self.dropout = nn.Dropout(config.dropout)
        self.activation_fn = get_activation(config.activation_function)
        self.self_attn_layer_norm = nn.LayerNorm(width, elementwise_affine=affine)
        self.fc1 = nn.Linear(width, config.ffn_dim, bias=config.enable_bias)
        self.fc2 = nn.Linear(config.ffn_dim, width, bias=config.enable_bias)
        self.final_layer_norm = nn.LayerNorm(width, elementwise_affine=affine)

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False):
        pre = self.do_layer_norm_before  # OPT-350m normalises after each residual instead
        h = self.self_attn_layer_norm(hidden_states) if pre else hidden_states
        attn, weights = self.self_attn(h, attention_mask, cache, output_attentions)
        hidden_states = hidden_states + self.dropout(attn)
        if not pre:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        h = self.final_layer_norm(hidden_states) if pre else hidden_states
        hidden_states = hidden_states + self.dropout(self.fc2(self.activation_fn(self.fc1(h))))
        if not pre:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states, weights


class OPTPreTrainedModel(PreTrainedModel):
    config_class = OPTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["OPTDecoderLayer"]

    def _init_weights(self, module):
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm) and module.weight is not None:
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()


class OPTDecoder(OPTPreTrainedModel):
    def __init__(self, config: OPTConfig):
        super().__init__(config)
        width, words = config.hidden_size, config.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, words, config.pad_token_id)
        self.embed_positions = OPTLearnedPositionalEmbedding(config.max_position_embeddings, width)
        self.project_out = nn.Linear(width, words, bias=False) if words != width else None
        self.project_in = nn.Linear(words, width, bias=False) if words != width else None
        final_norm = config.do_layer_norm_before and not config.remove_final_layer_norm
        affine = config.layer_norm_elementwise_affine
        self.final_layer_norm = nn.LayerNorm(width, elementwise_affine=affine) if final_norm else None
        self.layers = nn.ModuleList([OPTDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                cache=None) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        use_cache = use_cache_under_checkpointing(self.layers, use_cache, self.training)
        output_attentions, output_hidden_states = self._output_flags(output_attentions, output_hidden_states)
        past_key_values = prepare_past_key_values(past_key_values, cache, use_cache)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        batch, q_len = inputs_embeds.shape[:2]
        if position_ids is None:  # count the real tokens: a left-padded row starts at position 0 (pads at -1)
            mask = attention_mask
            if mask is None:
                mask = torch.ones(batch, past_len + q_len, dtype=torch.long, device=inputs_embeds.device)
            position_ids = ((torch.cumsum(mask, dim=1) * mask - 1).long())[:, past_len:]
        if self.project_in is not None:
            inputs_embeds = self.project_in(inputs_embeds)
        hidden = inputs_embeds + self.embed_positions(position_ids).to(inputs_embeds.device)
        causal = create_causal_mask(attention_mask, q_len, past_len, hidden.dtype, hidden.device)
        all_hidden, all_attn = [], []
        for layer in self.layers:
            all_hidden.append(hidden)
            if self.training and self.config.layerdrop > 0.0 and torch.rand([]) < self.config.layerdrop:
                continue  # LayerDrop (Fan et al. 2019)
            hidden, weights = layer(hidden, causal, past_key_values if use_cache else None, output_attentions)
            all_attn.append(weights)
        if self.final_layer_norm is not None:
            hidden = self.final_layer_norm(hidden)
        if self.project_out is not None:
            hidden = self.project_out(hidden)
        out = BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=past_key_values if use_cache else None,
                                      hidden_states=(*all_hidden, hidden) if output_hidden_states else None,
                                      attentions=tuple(all_attn) if output_attentions else None)
        return out if _return_dict(self, return_dict) else out.to_tuple()


class OPTModel(OPTPreTrainedModel):
    def __init__(self, config: OPTConfig):
        super().__init__(config)
        self.decoder = OPTDecoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.decoder.embed_tokens

    def set_input_embeddings(self, value):
        self.decoder.embed_tokens = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                cache=None) -> BaseModelOutputWithPast:
        return self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                            output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                            return_dict=return_dict, cache=cache)


class OPTForCausalLM(OPTPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
    accepts_loss_kwargs = True

    def __init__(self, config: OPTConfig):
        super().__init__(config)
        self.model = OPTModel(config)
        self.lm_head = nn.Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                logits_to_keep: int = 0, cache=None, **loss_kwargs) -> CausalLMOutputWithPast:
        out = self.model.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 past_key_values=past_key_values if past_key_values is not None else cache,
                                 inputs_embeds=inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
                                 output_hidden_states=output_hidden_states, return_dict=True)
        return causal_lm_output(self, out, labels, logits_to_keep, return_dict, **loss_kwargs)


class OPTForSequenceClassification(GenericForSequenceClassification, OPTPreTrainedModel):
    base_model_class = OPTModel
