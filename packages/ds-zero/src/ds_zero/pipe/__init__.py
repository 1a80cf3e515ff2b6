"""``ds_zero.pipe``: pipeline parallelism as ``deepspeed.pipe`` (PipelineModule, LayerSpec, TiedLayerSpec, grid)."""

from ds_zero._compat.engine import PipelineEngine
from ds_zero.pipe.module import LayerSpec, PipelineError, PipelineModule, TiedLayerSpec
from ds_zero.pipe.timeline import measured_timeline, render_svg, schedule_timeline
from ds_zero.pipe.topology import (
    PipeDataParallelTopology,
    PipelineParallelGrid,
    PipeModelDataParallelTopology,
    ProcessTopology,
)

__all__ = ["LayerSpec", "PipelineError", "PipelineModule", "TiedLayerSpec", "PipeDataParallelTopology",
           "PipelineParallelGrid", "PipeModelDataParallelTopology", "ProcessTopology", "PipelineEngine",
           "schedule_timeline", "measured_timeline", "render_svg"]
