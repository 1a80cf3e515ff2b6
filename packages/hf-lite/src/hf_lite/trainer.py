"""``hf_lite.trainer`` (transformers' ``trainer.py``): ``Trainer`` is the core loop (``trainer_loop.py``: ``train`` ->
``_inner_training_loop`` -> ``training_step`` -> ``compute_loss``, evaluation, checkpoints) with transformers'
defaults and script methods around it (``_compat/trainer.py``)."""

from ._compat.data_collator import DataCollatorWithPadding, default_data_collator
from ._compat.integrations import get_reporting_integration_callbacks
from ._compat.trainer import Trainer
from ._compat.trainer_callbacks import PrinterCallback, ProgressCallback
from ._compat.training_args import TrainingArguments
from .loss_utils import ForCausalLMLoss
from .modeling_utils import PreTrainedModel
from .optimization import get_scheduler
from .trainer_events import CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState
from .trainer_pt_utils import IterableDatasetShard
from .trainer_utils import OptimizerNames, has_length, seed_worker, set_seed, speed_metrics

# transformers' trainer.py has these names at module level too (scripts import them from there)
__all__ = [
    "CallbackHandler", "DataCollatorWithPadding", "DefaultFlowCallback", "ForCausalLMLoss", "IterableDatasetShard",
    "OptimizerNames", "PreTrainedModel", "PrinterCallback", "ProgressCallback", "Trainer", "TrainerControl",
    "TrainerState", "TrainingArguments", "default_data_collator", "get_reporting_integration_callbacks",
    "get_scheduler", "has_length", "seed_worker", "set_seed", "speed_metrics",
]
