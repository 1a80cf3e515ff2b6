"""The Auto classes (``transformers.models.auto``). Importing this package registers the families of
``_compat/models`` with them, so every path to ``AutoConfig`` / ``AutoModel*`` knows them."""

from ..._compat.models.auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, AutoModelForSequenceClassification
from .configuration_auto import CONFIG_MAPPING, AutoConfig
from .modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING, AutoModel, AutoModelForCausalLM

__all__ = [
    "CONFIG_MAPPING",
    "MODEL_FOR_CAUSAL_LM_MAPPING",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
    "MODEL_MAPPING",
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoModelForSequenceClassification",
]
