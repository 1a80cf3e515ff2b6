"""The families of ``_compat/models`` registered with the core Auto classes through their public ``register`` (the
core Auto module knows GPT-2 and Llama only), and ``AutoModelForSequenceClassification`` (transformers'
``models/auto/modeling_auto.py``)."""

from __future__ import annotations

from ...models.auto.configuration_auto import AutoConfig
from ...models.auto.modeling_auto import AutoModel, AutoModelForCausalLM, _BaseAutoModelClass
from ...models.gpt2.configuration_gpt2 import GPT2Config
from ...models.llama.configuration_llama import LlamaConfig
from . import gemma, mistral, opt, phi3, qwen2, qwen3, rope_utils  # noqa: F401  (rope_utils registers)
from .gpt2 import GPT2ForSequenceClassification
from .llama import LlamaForSequenceClassification

MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING: dict[type, type] = {
    GPT2Config: GPT2ForSequenceClassification,
    LlamaConfig: LlamaForSequenceClassification,
}


class AutoModelForSequenceClassification(_BaseAutoModelClass):
    _model_mapping = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING


# model_type -> (config, base model, causal LM, sequence classification), transformers' class names.
FAMILIES = {
    "mistral": (mistral.MistralConfig, mistral.MistralModel, mistral.MistralForCausalLM,
                mistral.MistralForSequenceClassification),
    "qwen2": (qwen2.Qwen2Config, qwen2.Qwen2Model, qwen2.Qwen2ForCausalLM, qwen2.Qwen2ForSequenceClassification),
    "qwen3": (qwen3.Qwen3Config, qwen3.Qwen3Model, qwen3.Qwen3ForCausalLM, qwen3.Qwen3ForSequenceClassification),
    "gemma": (gemma.GemmaConfig, gemma.GemmaModel, gemma.GemmaForCausalLM, gemma.GemmaForSequenceClassification),
    "phi3": (phi3.Phi3Config, phi3.Phi3Model, phi3.Phi3ForCausalLM, phi3.Phi3ForSequenceClassification),
    "opt": (opt.OPTConfig, opt.OPTModel, opt.OPTForCausalLM, opt.OPTForSequenceClassification),
}

for _model_type, (_config, _base, _causal_lm, _classifier) in FAMILIES.items():
    AutoConfig.register(_model_type, _config, exist_ok=True)
    AutoModel.register(_config, _base, exist_ok=True)
    AutoModelForCausalLM.register(_config, _causal_lm, exist_ok=True)
    AutoModelForSequenceClassification.register(_config, _classifier, exist_ok=True)
