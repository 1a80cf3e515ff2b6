"""GPT-2 (Radford et al. 2019) with transformers' module and parameter names, so checkpoints interchange.

``Conv1D`` stores its weight as (in, out), exactly as OpenAI's TF checkpoint and transformers do.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...activations import get_activation
from ...attention_utils import attention_forward
from ...cache_utils import DynamicCache, prepare_past_key_values
from ...generation.utils import GenerationMixin
from ...loss_utils import _return_dict, causal_lm_output
from ...masking_utils import create_causal_mask
from ...modeling_layers import GradientCheckpointingLayer, use_cache_under_checkpointing
from ...modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from ...modeling_utils import PreTrainedModel
from .configuration_gpt2 import GPT2Config


class Conv1D(nn.Module):
    """A linear layer with a transposed (in, out) weight: ``y = x @ W + b``."""

    def __init__(self, nf: int, nx: int):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], self.nf)


class GPT2Attention(nn.Module):
    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        self.embed_dim = config.n_embd
        self.num_heads = config.n_head
        self.head_dim = self.embed_dim // self.num_heads
        self.layer_idx = layer_idx
        self.scaling = self.head_dim**-0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scaling /= float(layer_idx + 1)
        self.c_attn = Conv1D(3 * self.embed_dim, self.embed_dim)
        self.c_proj = Conv1D(self.embed_dim, self.embed_dim)
        self.attn_dropout = nn.Dropout(config.attn_pdrop)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, hidden_states, attention_mask=None, cache: DynamicCache | None = None, output_attentions=False):
        bsz, q_len, _ = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(self.embed_dim, dim=2)
        q, k, v = (t.view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        dropout = self.attn_dropout.p if self.training else 0.0
        out, weights = attention_forward(q, k, v, attention_mask, self.scaling, dropout, output_attentions)
        out = out.transpose(1, 2).reshape(bsz, q_len, self.embed_dim)
        return self.resid_dropout(self.c_proj(out)), weights


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size: int, config: GPT2Config):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, config.n_embd)
        self.c_proj = Conv1D(config.n_embd, intermediate_size)
        self.act = get_activation(config.activation_function)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(GradientCheckpointingLayer):
    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(inner, config)

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False):
        attn, weights = self.attn(self.ln_1(hidden_states), attention_mask, cache, output_attentions)
        hidden_states = hidden_states + attn
        return hidden_states + self.mlp(self.ln_2(hidden_states)), weights


class GPT2PreTrainedModel(PreTrainedModel):
    config_class = GPT2Config
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GPT2Block"]
    _keys_to_ignore_on_load_unexpected = [r"attn\.bias$", r"attn\.masked_bias$"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, Conv1D)):
            # GPT-2 paper sec. 2.3: residual projections scaled by 1/sqrt(N) at init, N = 2 residuals per layer.
            if getattr(module, "_is_residual_proj", False):
                std = std / math.sqrt(2 * self.config.n_layer)
            module.weight.data.normal_(0.0, std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, std)
        elif isinstance(module, nn.LayerNorm):
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()


class GPT2Model(GPT2PreTrainedModel):
    def __init__(self, config: GPT2Config):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = nn.ModuleList([GPT2Block(config, i) for i in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        for block in self.h:
            block.attn.c_proj._is_residual_proj = True
            block.mlp.c_proj._is_residual_proj = True
        self.post_init()

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, value):
        self.wte = value

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                cache=None) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("You must specify exactly one of input_ids or inputs_embeds")
        config = self.config
        use_cache = config.use_cache if use_cache is None else use_cache
        use_cache = use_cache_under_checkpointing(self.h, use_cache, self.training)
        output_attentions, output_hidden_states = self._output_flags(output_attentions, output_hidden_states)
        past_key_values = prepare_past_key_values(past_key_values, cache, use_cache)
        if inputs_embeds is None:
            inputs_embeds = self.wte(input_ids)
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        q_len = inputs_embeds.shape[1]
        if past_len + q_len > config.n_positions:
            raise ValueError(f"sequence length {past_len + q_len} exceeds n_positions={config.n_positions}")
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + q_len, device=inputs_embeds.device)[None]
        hidden = inputs_embeds + self.wpe(position_ids)
        if token_type_ids is not None:  # GPT-2 embeds segment ids with the token table (transformers)
            hidden = hidden + self.wte(token_type_ids)
        hidden = self.drop(hidden)
        mask = create_causal_mask(attention_mask, q_len, past_len, hidden.dtype, hidden.device)
        all_hidden, all_attn = [], []
        for block in self.h:
            all_hidden.append(hidden)
            hidden, weights = block(hidden, mask, past_key_values if use_cache else None, output_attentions)
            all_attn.append(weights)
        hidden = self.ln_f(hidden)
        out = BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=past_key_values if use_cache else None,
                                      hidden_states=(*all_hidden, hidden) if output_hidden_states else None,
                                      attentions=tuple(all_attn) if output_attentions else None)
        return out if _return_dict(self, return_dict) else out.to_tuple()


class GPT2LMHeadModel(GPT2PreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    accepts_loss_kwargs = True  # the Trainer then passes num_items_in_batch (gradient accumulation)

    def __init__(self, config: GPT2Config):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, past_key_values=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, logits_to_keep: int = 0, cache=None, **loss_kwargs) -> CausalLMOutputWithPast:
        out = self.transformer(input_ids=input_ids,
                               past_key_values=past_key_values if past_key_values is not None else cache,
                               attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
                               inputs_embeds=inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
                               output_hidden_states=output_hidden_states, return_dict=True)
        return causal_lm_output(self, out, labels, logits_to_keep, return_dict, **loss_kwargs)
