"""paged_serve: vLLM rebuilt small. ``from paged_serve import LLM, SamplingParams`` works like vLLM's import."""

from paged_serve._compat import beam_search as _beam_search  # noqa: F401 (plugs into the output processor)
from paged_serve._compat.arg_utils import EngineArgs
from paged_serve._compat.llm import LLM
from paged_serve._compat.model_executor.models import registry as _model_families  # noqa: F401 (registers them)
from paged_serve.engine.llm_engine import LLMEngine
from paged_serve.inputs import PromptType, TextPrompt, TokensPrompt
from paged_serve.outputs import CompletionOutput, RequestOutput
from paged_serve.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "LLMEngine",
    "PromptType",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
]
