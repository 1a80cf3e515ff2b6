"""Test helpers scripts import (transformers' ``testing_utils.py``): ``CaptureLogger`` collects what a logger
writes inside a ``with`` block into ``.out``."""

from __future__ import annotations

import io
import logging


class CaptureLogger:
    """``with CaptureLogger(logger) as cl: ...`` then ``cl.out`` holds the records the block logged."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self.io = io.StringIO()
        self.sh = logging.StreamHandler(self.io)
        self.out = ""

    def __enter__(self) -> CaptureLogger:
        self.logger.addHandler(self.sh)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.sh)
        self.out = self.io.getvalue()

    def __repr__(self) -> str:
        return f"captured: {self.out}\n"
