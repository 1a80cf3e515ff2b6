"""hf_lite: the core of Hugging Face Transformers rebuilt small (configs, models, Auto classes, safetensors I/O,
byte-level BPE, generation and the Trainer's loop), interoperable with the real library through the checkpoint
directory format. The names transformers' users import; the tokenizer interface, the Trainer's surface and the other
compatibility pieces are in ``_compat/``."""

from ._compat.optimization import (
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_polynomial_decay_schedule_with_warmup,
)
from ._compat.torch_ddp import TorchDDPPlugin
from ._compat.trainer_utils import enable_full_determinism, torch_distributed_zero_first
from .cache_utils import DynamicCache
from .checkpoint_utils import CheckpointError
from .configuration_utils import PreTrainedConfig, PretrainedConfig
from .data import (
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    DefaultDataCollator,
    GroupedTextsDataset,
    IterableGroupedTextsDataset,
    default_data_collator,
    group_texts,
)
from .generation import (
    AsyncTextIteratorStreamer,
    EosTokenCriteria,
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    ExponentialDecayLengthPenalty,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    GenerationConfig,
    GenerationMixin,
    InfNanRemoveLogitsProcessor,
    LogitNormalization,
    LogitsProcessor,
    LogitsProcessorList,
    MaxLengthCriteria,
    MaxTimeCriteria,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    StopStringCriteria,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TextIteratorStreamer,
    TextStreamer,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)
from .hf_argparser import HfArgumentParser
from .integrations import JSONLinesCallback, TensorBoardCallback, is_tensorboard_available
from .modeling_utils import PreTrainedModel
from .models.auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, AutoModelForSequenceClassification
from .models.auto.configuration_auto import CONFIG_MAPPING, AutoConfig
from .models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING, AutoModel, AutoModelForCausalLM
from .models.auto.tokenization_auto import AutoTokenizer
from .models.gemma import (
    GemmaConfig,
    GemmaForCausalLM,
    GemmaForSequenceClassification,
    GemmaModel,
    GemmaPreTrainedModel,
)
from .models.gpt2 import GPT2ForSequenceClassification, GPT2PreTrainedModel
from .models.gpt2.configuration_gpt2 import GPT2Config
from .models.gpt2.modeling_gpt2 import GPT2LMHeadModel, GPT2Model
from .models.llama import LlamaForSequenceClassification, LlamaPreTrainedModel
from .models.llama.configuration_llama import LlamaConfig
from .models.llama.modeling_llama import LlamaForCausalLM, LlamaModel
from .models.mistral import (
    MistralConfig,
    MistralForCausalLM,
    MistralForSequenceClassification,
    MistralModel,
    MistralPreTrainedModel,
)
from .models.opt import OPTConfig, OPTForCausalLM, OPTForSequenceClassification, OPTModel, OPTPreTrainedModel
from .models.phi3 import Phi3Config, Phi3ForCausalLM, Phi3ForSequenceClassification, Phi3Model, Phi3PreTrainedModel
from .models.qwen2 import (
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen2Model,
    Qwen2PreTrainedModel,
)
from .models.qwen3 import (
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
    Qwen3PreTrainedModel,
)
from .optimization import (
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
    get_scheduler,
)
from .pipelines import (
    FeatureExtractionPipeline,
    Pipeline,
    TextClassificationPipeline,
    TextGenerationPipeline,
    pipeline,
)
from .tokenization_gpt2 import GPT2Tokenizer
from .tokenization_utils import PreTrainedTokenizer
from .tokenization_utils_base import BatchEncoding, PreTrainedTokenizerBase
from .tokenization_utils_fast import PreTrainedTokenizerFast
from .trainer import Trainer
from .trainer_callback import (
    DefaultFlowCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from .trainer_distributed import DataParallelPlugin
from .trainer_utils import EvalPrediction, IntervalStrategy, SchedulerType, get_last_checkpoint, set_seed
from .training_args import ParallelMode, TrainingArguments
from .utils import (
    is_datasets_available,
    is_tokenizers_available,
    is_torch_available,
    is_torch_xla_available,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncTextIteratorStreamer",
    "Pipeline",
    "FeatureExtractionPipeline",
    "TextClassificationPipeline",
    "TextGenerationPipeline",
    "pipeline",
    "CONFIG_MAPPING",
    "MODEL_FOR_CAUSAL_LM_MAPPING",
    "MODEL_MAPPING",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
    "AutoModelForSequenceClassification",
    "GPT2ForSequenceClassification",
    "GPT2PreTrainedModel",
    "LlamaForSequenceClassification",
    "LlamaPreTrainedModel",
    "GemmaConfig",
    "GemmaForCausalLM",
    "GemmaForSequenceClassification",
    "GemmaModel",
    "GemmaPreTrainedModel",
    "MistralConfig",
    "MistralForCausalLM",
    "MistralForSequenceClassification",
    "MistralModel",
    "MistralPreTrainedModel",
    "OPTConfig",
    "OPTForCausalLM",
    "OPTForSequenceClassification",
    "OPTModel",
    "OPTPreTrainedModel",
    "Phi3Config",
    "Phi3ForCausalLM",
    "Phi3ForSequenceClassification",
    "Phi3Model",
    "Phi3PreTrainedModel",
    "Qwen2Config",
    "Qwen2ForCausalLM",
    "Qwen2ForSequenceClassification",
    "Qwen2Model",
    "Qwen2PreTrainedModel",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "Qwen3ForSequenceClassification",
    "Qwen3Model",
    "Qwen3PreTrainedModel",
    "ParallelMode",
    "is_torch_xla_available",
    "AutoConfig",
    "AutoModel",
    "AutoModelForCausalLM",
    "AutoTokenizer",
    "BatchEncoding",
    "CheckpointError",
    "DataCollatorForLanguageModeling",
    "DataCollatorWithPadding",
    "DataParallelPlugin",
    "DefaultFlowCallback",
    "DynamicCache",
    "EarlyStoppingCallback",
    "EvalPrediction",
    "GPT2Config",
    "GPT2LMHeadModel",
    "GPT2Model",
    "GPT2Tokenizer",
    "GenerationConfig",
    "GenerationMixin",
    "GroupedTextsDataset",
    "HfArgumentParser",
    "IntervalStrategy",
    "IterableGroupedTextsDataset",
    "JSONLinesCallback",
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
    "PrinterCallback",
    "ProgressCallback",
    "SchedulerType",
    "StoppingCriteriaList",
    "TensorBoardCallback",
    "TextIteratorStreamer",
    "TextStreamer",
    "TorchDDPPlugin",
    "Trainer",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "TrainingArguments",
    "default_data_collator",
    "get_last_checkpoint",
    "get_scheduler",
    "group_texts",
    "set_seed",
    "EosTokenCriteria",
    "EpsilonLogitsWarper",
    "EtaLogitsWarper",
    "ExponentialDecayLengthPenalty",
    "ForcedBOSTokenLogitsProcessor",
    "ForcedEOSTokenLogitsProcessor",
    "InfNanRemoveLogitsProcessor",
    "LogitNormalization",
    "LogitsProcessor",
    "MaxLengthCriteria",
    "MaxTimeCriteria",
    "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor",
    "MinPLogitsWarper",
    "NoBadWordsLogitsProcessor",
    "NoRepeatNGramLogitsProcessor",
    "PrefixConstrainedLogitsProcessor",
    "RepetitionPenaltyLogitsProcessor",
    "SequenceBiasLogitsProcessor",
    "StopStringCriteria",
    "StoppingCriteria",
    "SuppressTokensAtBeginLogitsProcessor",
    "SuppressTokensLogitsProcessor",
    "TemperatureLogitsWarper",
    "TopKLogitsWarper",
    "TopPLogitsWarper",
    "TypicalLogitsWarper",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_inverse_sqrt_schedule",
    "get_polynomial_decay_schedule_with_warmup",
    "enable_full_determinism",
    "torch_distributed_zero_first",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_linear_schedule_with_warmup",
    "DefaultDataCollator",
    "is_tensorboard_available",
    "is_datasets_available",
    "is_tokenizers_available",
    "is_torch_available",
]
