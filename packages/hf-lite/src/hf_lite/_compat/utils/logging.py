"""The library's logging (transformers' ``utils/logging.py``): every hf-lite module logs under the ``hf_lite``
logger, whose level these functions set (``set_verbosity_info``...) and which gets a default stderr handler and
transformers' explicit format on request, as example scripts configure it."""

from __future__ import annotations

import logging
import os
import sys
import threading
from logging import CRITICAL, DEBUG, ERROR, FATAL, INFO, NOTSET, WARN, WARNING  # noqa: F401

_LIBRARY = "hf_lite"
_lock = threading.Lock()
_default_handler: logging.Handler | None = None


def _root() -> logging.Logger:
    return logging.getLogger(_LIBRARY)


def _configure_library_root_logger() -> None:
    """Create the default handler once; the level comes from ``TRANSFORMERS_VERBOSITY`` if set (else warning)."""
    global _default_handler
    with _lock:
        if _default_handler is not None:
            return
        _default_handler = logging.StreamHandler(sys.stderr)
        _default_handler.flush = sys.stderr.flush
        env = os.environ.get("TRANSFORMERS_VERBOSITY")
        if env and _root().level == NOTSET:
            _root().setLevel(getattr(logging, env.upper(), WARNING))


def get_logger(name: str | None = None) -> logging.Logger:
    """``get_logger()`` is the library's logger; ``get_logger(__name__)`` one of its modules' (or any name)."""
    return logging.getLogger(name if name is not None else _LIBRARY)


def get_verbosity() -> int:
    return _root().getEffectiveLevel()


def set_verbosity(verbosity: int) -> None:
    _root().setLevel(verbosity)


def set_verbosity_info() -> None:
    set_verbosity(INFO)


def set_verbosity_warning() -> None:
    set_verbosity(WARNING)


def set_verbosity_debug() -> None:
    set_verbosity(DEBUG)


def set_verbosity_error() -> None:
    set_verbosity(ERROR)


def enable_default_handler() -> None:
    """Log the library's records to stderr itself (and, as in transformers, no longer through the root logger)."""
    _configure_library_root_logger()
    root = _root()
    if _default_handler not in root.handlers:
        root.addHandler(_default_handler)
    root.propagate = False


def disable_default_handler() -> None:
    _configure_library_root_logger()
    _root().removeHandler(_default_handler)
    _root().propagate = True


def enable_explicit_format() -> None:
    """``[LEVEL|file:line] time >> message`` on every handler of the library's logger (transformers' format)."""
    formatter = logging.Formatter("[%(levelname)s|%(filename)s:%(lineno)s] %(asctime)s >> %(message)s")
    for handler in _root().handlers:
        handler.setFormatter(formatter)


def reset_format() -> None:
    for handler in _root().handlers:
        handler.setFormatter(None)


def enable_propagation() -> None:
    _root().propagate = True


def disable_propagation() -> None:
    _root().propagate = False


def get_log_levels_dict() -> dict[str, int]:
    return {"detail": DEBUG, "debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR, "critical": CRITICAL}


def add_handler(handler: logging.Handler) -> None:
    """Add a handler to the library's root logger."""
    _configure_library_root_logger()
    if handler is None:
        raise ValueError("add_handler needs a logging.Handler, got None")
    _root().addHandler(handler)


def remove_handler(handler: logging.Handler) -> None:
    _configure_library_root_logger()
    if handler is None or handler not in _root().handlers:
        raise ValueError(f"{handler!r} is not a handler of the {_LIBRARY!r} logger")
    _root().removeHandler(handler)


def captureWarnings(capture: bool) -> None:  # noqa: N802  (the stdlib's and transformers' name)
    """Route ``warnings`` through the ``py.warnings`` logger, at the library's level, with its default handler."""
    _configure_library_root_logger()
    logger = logging.getLogger("py.warnings")
    if not logger.handlers:
        logger.addHandler(_default_handler)
    logger.setLevel(_root().level)
    logging.captureWarnings(capture)


_progress_bars = True


def disable_progress_bar() -> None:
    """Bars made with this module's ``tqdm`` off for the process (the Trainer's follow ``disable_tqdm``)."""
    global _progress_bars
    _progress_bars = False


def enable_progress_bar() -> None:
    global _progress_bars
    _progress_bars = True


def is_progress_bar_enabled() -> bool:
    return _progress_bars


def tqdm(*args, **kwargs):
    """``tqdm.auto.tqdm``, disabled while ``disable_progress_bar()`` is in effect."""
    from tqdm.auto import tqdm as auto_tqdm

    return auto_tqdm(*args, **{**kwargs, "disable": kwargs.get("disable", False) or not _progress_bars})
