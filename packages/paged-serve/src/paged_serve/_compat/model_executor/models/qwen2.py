"""Qwen2 (vLLM ``models/qwen2.py``; transformers ``Qwen2ForCausalLM``): Llama with biases on q/k/v but not on the
output projection. Sliding-window layers are refused when loading the config (``use_sliding_window``)."""

from __future__ import annotations

from functools import partial

from paged_serve.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


class Qwen2Attention(LlamaAttention):
    def __init__(self, config: dict):
        super().__init__(config, bias=True, bias_o_proj=False)


class Qwen2ForCausalLM(LlamaForCausalLM):
    model_type = partial(LlamaModel, layer_type=partial(LlamaDecoderLayer, attention_type=Qwen2Attention))
