"""Llama (Touvron et al. 2023) with transformers' parameter names: RMSNorm, rotary embeddings (with rope_theta and
linear / llama3 scaling), grouped-query attention and a SwiGLU MLP."""

from __future__ import annotations

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
from .configuration_llama import LlamaConfig


class LlamaRMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dtype)


# rope_type -> f(inv_freq, rope_parameters): how a scaled RoPE rescales the frequencies; the scaled variants are
# registered by _compat/models/rope_utils.py.
ROPE_SCALING_FUNCTIONS = {"default": lambda inv_freq, params: inv_freq}


def compute_rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d) (RoFormer, Su et al. 2021 sec. 3.2.2), rescaled per ``rope_type``."""
    params = config.rope_parameters
    dim = config.head_dim
    inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return ROPE_SCALING_FUNCTIONS[params["rope_type"]](inv_freq, params)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.register_buffer("inv_freq", compute_rope_inv_freq(config), persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class LlamaMLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(act(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act_fn = get_activation(config.hidden_act)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaAttention(nn.Module):
    """Grouped-query attention (Ainslie et al. 2023): ``num_key_value_heads`` K/V heads shared by query groups."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache: DynamicCache | None = None,
                output_attentions=False):
        bsz, q_len, _ = hidden_states.shape
        q, k, v = self.project_qkv(hidden_states)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        # The cache stores the compact K/V heads; SDPA broadcasts each to its query group without copying.
        dropout = self.attention_dropout if self.training else 0.0
        out, weights = attention_forward(q, k, v, attention_mask, self.scaling, dropout, output_attentions)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1)), weights

    def project_qkv(self, hidden_states):
        """(batch, heads, seq, head_dim) queries, keys and values; the families with a fused or normed projection
        (Phi-3, Qwen3) override this step only."""
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        return (proj(hidden_states).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))


class LlamaDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask=None, cache=None, output_attentions=False):
        attn, weights = self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask, cache,
                                       output_attentions)
        h = hidden_states + attn
        return h + self.mlp(self.post_attention_layernorm(h)), weights


class LlamaPreTrainedModel(PreTrainedModel):
    config_class = LlamaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LlamaDecoderLayer"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(0.0, std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, LlamaRMSNorm):
            module.weight.data.fill_(1.0)


class LlamaModel(LlamaPreTrainedModel):
    decoder_layer_class = LlamaDecoderLayer  # what a family built on Llama's blocks replaces (``_compat/models``)

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        self.padding_idx = config.pad_token_id
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([self.decoder_layer_class(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
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
        q_len = inputs_embeds.shape[1]
        if position_ids is None:
            position_ids = torch.arange(past_len, past_len + q_len, device=inputs_embeds.device)[None]
        mask = create_causal_mask(attention_mask, q_len, past_len, inputs_embeds.dtype, inputs_embeds.device)
        hidden = inputs_embeds
        position_embeddings = self.rotary_emb(hidden, position_ids)
        all_hidden, all_attn = [], []
        for layer in self.layers:
            all_hidden.append(hidden)
            cache_arg = past_key_values if use_cache else None
            hidden, weights = layer(hidden, position_embeddings, mask, cache_arg, output_attentions)
            all_attn.append(weights)
        hidden = self.norm(hidden)
        out = BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=past_key_values if use_cache else None,
                                      hidden_states=(*all_hidden, hidden) if output_hidden_states else None,
                                      attentions=tuple(all_attn) if output_attentions else None)
        return out if _return_dict(self, return_dict) else out.to_tuple()


class LlamaForCausalLM(LlamaPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    accepts_loss_kwargs = True  # the Trainer then passes num_items_in_batch (gradient accumulation)
    base_model_class = LlamaModel

    def __init__(self, config: LlamaConfig):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                labels=None, use_cache=None, output_attentions=None, output_hidden_states=None, return_dict=None,
                logits_to_keep: int = 0, cache=None, **loss_kwargs) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values if past_key_values is not None else cache,
                         inputs_embeds=inputs_embeds, use_cache=use_cache, output_attentions=output_attentions,
                         output_hidden_states=output_hidden_states, return_dict=True)
        return causal_lm_output(self, out, labels, logits_to_keep, return_dict, **loss_kwargs)
