"""Phi-3 (vLLM ``models/phi3.py``, a Llama subclass there too; transformers ``Phi3ForCausalLM``): Llama whose
checkpoint already stores ``qkv_proj`` and ``gate_up_proj`` fused, so each goes whole to its weight loader, which
splits it and keeps this rank's heads and rows. Partial rotary and LongRoPE scaling are refused."""

from __future__ import annotations

from paged_serve.model_executor.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    stacked_params_mapping = ()

    def __init__(self, config: dict):
        if config.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"partial_rotary_factor {config['partial_rotary_factor']} is not supported for Phi-3")
        super().__init__(config)
