"""The model families beyond Llama and Mistral, registered into the core ``ModelRegistry`` (vLLM's
``models/registry.py`` lists them all): each exists so users' checkpoints load, and is built from the core's
parallel layers (and Llama's, where the family is Llama with differences)."""

from paged_serve._compat.model_executor.models.gpt2 import GPT2LMHeadModel
from paged_serve.model_executor.model_loader import ModelRegistry

_FAMILIES = {
    "GPT2LMHeadModel": GPT2LMHeadModel,
}
for _arch, _cls in _FAMILIES.items():
    ModelRegistry.register_model(_arch, _cls)
