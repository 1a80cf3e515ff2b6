"""OPT (vLLM ``models/opt.py``; transformers ``OPTForCausalLM``), the model vLLM's examples load first.

LayerNorm blocks (pre-norm, or post-norm when ``do_layer_norm_before`` is false as in opt-350m), learned positions
offset by 2, ReLU MLP (``fc1``/``fc2``), biases everywhere, and an optional projection between a narrower word
embedding and the hidden size (``word_embed_proj_dim``). On the parallel layers: q/k/v stacked into one
``QKVParallelLinear``, ``out_proj`` and ``fc2`` row-parallel, ``fc1`` column-parallel.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from paged_serve.model_executor.layers.attention import Attention
from paged_serve.model_executor.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from paged_serve.model_executor.layers.vocab_parallel_embedding import (
    LogitsProcessor,
    ParallelLMHead,
    VocabParallelEmbedding,
)
from paged_serve.model_executor.models.utils import load_weights

_ACTIVATIONS = {"relu": nn.functional.relu, "gelu": nn.functional.gelu}
POSITION_OFFSET = 2  # OPT's learned positions start at index 2 (transformers' OPTLearnedPositionalEmbedding)


class OPTAttention(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, heads, bias = config["hidden_size"], config["num_attention_heads"], config.get("enable_bias", True)
        self.head_dim = hidden // heads
        self.qkv_proj = QKVParallelLinear(hidden, self.head_dim, heads, bias=bias)
        self.num_heads = self.qkv_proj.num_heads
        self.out_proj = RowParallelLinear(hidden, hidden, bias=bias)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        q, k, v = self.qkv_proj(hidden_states)[0].chunk(3, dim=-1)
        return self.out_proj(self.attn(q, k, v, kv_cache, attn_metadata))[0]


class OPTDecoderLayer(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden, bias = config["hidden_size"], config.get("enable_bias", True)
        affine = config.get("layer_norm_elementwise_affine", True)
        act = config.get("activation_function", "relu")
        if act not in _ACTIVATIONS:
            raise ValueError(f"activation_function {act!r} not supported for OPT (one of {sorted(_ACTIVATIONS)})")
        self.act = _ACTIVATIONS[act]
        self.do_layer_norm_before = config.get("do_layer_norm_before", True)
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)
        self.fc1 = ColumnParallelLinear(hidden, config["ffn_dim"], bias=bias)
        self.fc2 = RowParallelLinear(config["ffn_dim"], hidden, bias=bias)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine)

    def _block(self, h, norm, fn):
        out = h + fn(norm(h) if self.do_layer_norm_before else h)
        return out if self.do_layer_norm_before else norm(out)

    def forward(self, hidden_states, kv_cache, attn_metadata):
        h = self._block(hidden_states, self.self_attn_layer_norm, lambda x: self.self_attn(x, kv_cache, attn_metadata))
        return self._block(h, self.final_layer_norm, lambda x: self.fc2(self.act(self.fc1(x)[0]))[0])


class OPTDecoder(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        hidden = config["hidden_size"]
        embed_dim = config.get("word_embed_proj_dim") or hidden
        self.embed_tokens = VocabParallelEmbedding(config["vocab_size"], embed_dim)
        self.embed_positions = nn.Embedding(config["max_position_embeddings"] + POSITION_OFFSET, hidden)
        narrow = embed_dim != hidden
        self.project_in = nn.Linear(embed_dim, hidden, bias=False) if narrow else None
        self.project_out = nn.Linear(hidden, embed_dim, bias=False) if narrow else None
        final_norm = config.get("do_layer_norm_before", True) and not config.get("_remove_final_layer_norm", False)
        affine = config.get("layer_norm_elementwise_affine", True)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine) if final_norm else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config) for _ in range(config["num_hidden_layers"]))

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        h = self.embed_tokens(input_ids)
        if self.project_in is not None:
            h = self.project_in(h)
        h = h + self.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, kv_cache, attn_metadata)
        if self.final_layer_norm is not None:
            h = self.final_layer_norm(h)
        return self.project_out(h) if self.project_out is not None else h


class OPTModel(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    stacked_params_mapping = (("q_proj", "qkv_proj", "q"), ("k_proj", "qkv_proj", "k"), ("v_proj", "qkv_proj", "v"))

    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        self.model = OPTModel(config)
        decoder = self.model.decoder
        self.lm_head = ParallelLMHead(config["vocab_size"], decoder.embed_tokens.embedding_dim)
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", True))
        if self.tie_word_embeddings:
            self.lm_head.tie_weights(decoder.embed_tokens)
        self.logits_processor = LogitsProcessor(config["vocab_size"])
        self.num_kv_heads, self.head_dim = decoder.layers[0].self_attn.num_heads, decoder.layers[0].self_attn.head_dim

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        return self.model.decoder(input_ids, positions, kv_caches, attn_metadata)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.decoder.embed_tokens

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, object]]) -> None:
        rename = lambda name: "model." + name if name.startswith("decoder.") else name  # noqa: E731 (older files)
        load_weights(self, weights, self.stacked_params_mapping, rename=rename)
