from .._compat.utils.import_utils import is_tensorboard_available
from .integration_utils import (
    INTEGRATION_TO_CALLBACK,
    JSONLinesCallback,
    TensorBoardCallback,
    get_reporting_integration_callbacks,
)

__all__ = ["INTEGRATION_TO_CALLBACK", "JSONLinesCallback", "TensorBoardCallback", "get_reporting_integration_callbacks",
           "is_tensorboard_available"]
