"""``deepspeed.utils.logging``: the library's logger (stdout, WARNING, its own format, not propagated, as DeepSpeed's
``LoggerFactory.create_logger`` makes it) and ``log_dist``, which logs on the listed ranks only."""

from __future__ import annotations

import json
import logging
import sys

import torch.distributed as dist

LOG_FORMAT = "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"


def _make_logger(name: str, level: int = logging.WARNING) -> logging.Logger:
    log = logging.getLogger(name)
    if not log.handlers:
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    return log


logger = _make_logger("ds_zero.utils")


def _rank_if_logging(ranks) -> int | None:
    """Without a process group every caller logs (as rank -1); with one, the ranks listed (-1 first: all)."""
    if not dist.is_initialized():
        return -1
    rank, ranks = dist.get_rank(), list(ranks or [])
    return rank if ranks and (ranks[0] == -1 or rank in ranks) else None


def get_dist_msg(message: str, ranks=None) -> str | None:
    """"[Rank r] message" where ``log_dist`` would log it, else None (DeepSpeed's ``get_dist_msg``)."""
    rank = _rank_if_logging(ranks)
    return None if rank is None else f"[Rank {rank}] {message}"


def log_dist(message: str, ranks=None, level: int = logging.INFO) -> None:
    """Log ``message`` as "[Rank r] message" on the ranks in ``ranks`` (DeepSpeed's ``log_dist``)."""
    final = get_dist_msg(message, ranks)
    if final is not None:
        logger.log(level, final)


def print_json_dist(message: dict, ranks=None, path: str | None = None) -> None:
    """Write ``message`` (a dict, with its rank added) as JSON to ``path`` on the listed ranks."""
    if path is None:
        raise ValueError("print_json_dist needs path=, the file to write the JSON to")
    rank = _rank_if_logging(ranks)
    if rank is not None:
        with open(path, "w") as f:
            json.dump({**message, "rank": rank}, f)
            f.flush()
