"""GPT: the model and its layer specs (``megatron/core/models/gpt``)."""

from mega_par.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from mega_par.models.gpt.gpt_model import GPTModel

__all__ = ["GPTModel", "get_gpt_layer_local_spec"]
