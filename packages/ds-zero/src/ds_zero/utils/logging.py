"""``deepspeed.utils.logging`` at its path."""

from ds_zero._compat.logging import LOG_FORMAT, get_dist_msg, log_dist, logger, print_json_dist

__all__ = ["LOG_FORMAT", "get_dist_msg", "log_dist", "logger", "print_json_dist"]
