"""Gemma (vLLM ``models/gemma.py``; transformers ``GemmaForCausalLM``): Llama with the embedding scaled by
sqrt(hidden_size), RMSNorm scaling by ``1 + weight`` in fp32, a tanh-GELU gate in the MLP and the head tied to the
embedding."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from paged_serve.model_executor.layers.layernorm import RMSNorm
from paged_serve.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel


class GemmaRMSNorm(RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(x.dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.gelu(x, approximate="tanh")


class GemmaModel(LlamaModel):
    def __init__(self, config: dict):
        act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu"):  # transformers runs Gemma's "gelu" as the tanh form too
            raise ValueError(f"hidden_activation {act!r} not supported for Gemma (gelu_pytorch_tanh)")
        layer = partial(LlamaDecoderLayer, mlp_type=partial(LlamaMLP, act_fn=_gelu_tanh), norm_type=GemmaRMSNorm)
        super().__init__(config, layer_type=layer, norm_type=GemmaRMSNorm)
        self.normalizer = config["hidden_size"] ** 0.5

    def get_input_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        return h * torch.tensor(self.normalizer, dtype=h.dtype)  # rounded to the activations' dtype, as transformers


class GemmaForCausalLM(LlamaForCausalLM):
    model_type = GemmaModel

    def __init__(self, config: dict):
        super().__init__({**config, "tie_word_embeddings": config.get("tie_word_embeddings", True)})
