"""hf_lite: the core of Hugging Face Transformers rebuilt small (configs, models, Auto classes, safetensors I/O,
tokenizers and generation), interoperable with the real library through the checkpoint directory format."""

from .cache_utils import DynamicCache
from .checkpoint_utils import CheckpointError
from .configuration_utils import PreTrainedConfig, PretrainedConfig
from .generation import (
    GenerationConfig,
    GenerationMixin,
    LogitsProcessorList,
    StoppingCriteriaList,
    TextIteratorStreamer,
    TextStreamer,
)
from .modeling_utils import PreTrainedModel
from .models.auto.configuration_auto import AutoConfig
from .models.auto.modeling_auto import AutoModel, AutoModelForCausalLM
from .models.gpt2.configuration_gpt2 import GPT2Config
from .models.gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model
from .models.llama.configuration_llama import LlamaConfig
from .models.llama.modeling_llama import LlamaForCausalLM, LlamaModel

__version__ = "0.1.0"

__all__ = [
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoTokenizer",
    "BatchEncoding",
    "CheckpointError",
    "DynamicCache",
    "GPT2Config",
    "GPT2LMHeadModel",
    "GPT2Model",
    "GPT2Tokenizer",
    "GenerationConfig",
    "GenerationMixin",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaModel",
    "LogitsProcessorList",
    "PreTrainedConfig",
    "PreTrainedModel",
    "PreTrainedTokenizer",
    "PreTrainedTokenizerBase",
    "PreTrainedTokenizerFast",
    "PretrainedConfig",
    "StoppingCriteriaList",
    "TextIteratorStreamer",
    "TextStreamer",
]
