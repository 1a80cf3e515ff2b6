from .integration_utils import (
    INTEGRATION_TO_CALLBACK,
    JSONLinesCallback,
    TensorBoardCallback,
    get_reporting_integration_callbacks,
)

__all__ = ["INTEGRATION_TO_CALLBACK", "JSONLinesCallback", "TensorBoardCallback", "get_reporting_integration_callbacks"]
