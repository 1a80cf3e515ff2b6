"""Pipeline parallelism: schedules (no pipelining, 1F1B, interleaved 1F1B) and stage-to-stage p2p."""

from mega_par.pipeline_parallel.schedules import get_forward_backward_func

__all__ = ["get_forward_backward_func"]
