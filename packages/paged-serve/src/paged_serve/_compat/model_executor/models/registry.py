"""The model families beyond Llama and Mistral, registered into the core ``ModelRegistry`` (vLLM's
``models/registry.py`` lists them all): each exists so users' checkpoints load, and is built from the core's
parallel layers (and Llama's, where the family is Llama with differences)."""

from paged_serve._compat.model_executor import rope_scalings  # noqa: F401 (registers linear and llama3)
from paged_serve._compat.model_executor.models.gemma import GemmaForCausalLM
from paged_serve._compat.model_executor.models.gpt2 import GPT2LMHeadModel
from paged_serve._compat.model_executor.models.opt import OPTForCausalLM
from paged_serve._compat.model_executor.models.phi3 import Phi3ForCausalLM
from paged_serve._compat.model_executor.models.qwen2 import Qwen2ForCausalLM
from paged_serve._compat.model_executor.models.qwen3 import Qwen3ForCausalLM
from paged_serve.model_executor.model_loader import ModelRegistry

_FAMILIES = {
    "GPT2LMHeadModel": GPT2LMHeadModel,
    "OPTForCausalLM": OPTForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "GemmaForCausalLM": GemmaForCausalLM,
    "Phi3ForCausalLM": Phi3ForCausalLM,
}
for _arch, _cls in _FAMILIES.items():
    ModelRegistry.register_model(_arch, _cls)
