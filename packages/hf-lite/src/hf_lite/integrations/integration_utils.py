"""``hf_lite.integrations.integration_utils`` (transformers' ``integrations/integration_utils.py``): the reporting
callbacks ``report_to`` names, in ``_compat/integrations.py``."""

from .._compat.integrations import (
    INTEGRATION_TO_CALLBACK,
    JSONLinesCallback,
    TensorBoardCallback,
    get_reporting_integration_callbacks,
)
from ..trainer_events import TrainerCallback

__all__ = ["INTEGRATION_TO_CALLBACK", "JSONLinesCallback", "TensorBoardCallback", "TrainerCallback",
           "get_reporting_integration_callbacks"]
