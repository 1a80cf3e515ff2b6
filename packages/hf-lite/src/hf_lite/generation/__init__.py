"""Generation: configuration, logits processors, stopping criteria, streamers and ``GenerationMixin.generate``."""

from .configuration_utils import GenerationConfig
from .logits_process import (
    InfNanRemoveLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from .stopping_criteria import (
    EosTokenCriteria,
    MaxLengthCriteria,
    MaxNewTokensCriteria,
    MaxTimeCriteria,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
)
from .streamers import BaseStreamer, TextIteratorStreamer, TextStreamer
from .utils import GenerationMixin

__all__ = [
    "BaseStreamer",
    "EosTokenCriteria",
    "GenerationConfig",
    "GenerationMixin",
    "InfNanRemoveLogitsProcessor",
    "LogitsProcessor",
    "LogitsProcessorList",
    "MaxLengthCriteria",
    "MaxNewTokensCriteria",
    "MaxTimeCriteria",
    "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor",
    "MinPLogitsWarper",
    "NoBadWordsLogitsProcessor",
    "NoRepeatNGramLogitsProcessor",
    "RepetitionPenaltyLogitsProcessor",
    "StopStringCriteria",
    "StoppingCriteria",
    "StoppingCriteriaList",
    "SuppressTokensLogitsProcessor",
    "TemperatureLogitsWarper",
    "TextIteratorStreamer",
    "TextStreamer",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
]
