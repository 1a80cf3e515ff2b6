"""Pipeline timelines: the ideal one a schedule implies and the one a run measured, as data and as an SVG picture
(stages down, time across, forward and backward passes coloured, micro-batch numbers inside).

``schedule_timeline(stages, micro_batches)`` walks :class:`TrainSchedule` with unit-time passes; every stage is
busy ``2m`` of ``2(m + p - 1)`` ticks, so its bubble is ``(p - 1) / (m + p - 1)``.
``measured_timeline(events)`` takes each stage's ``PipelineEngine.timeline`` (gathered to one place) and
measures the same quantity in seconds.
"""

from __future__ import annotations

from ds_zero.pipe.schedule import GPipeSchedule, TrainSchedule

_COLOURS = {"F": "#4e79a7", "B": "#f28e2b"}


def schedule_timeline(stages: int, micro_batches: int, schedule_cls=TrainSchedule) -> dict:
    """``{"rows": per stage [(start, end, "F"|"B", micro_batch)], "span", "bubble": per stage, "bubble_fraction"}``."""
    rows, bubbles = [], []
    span = 0
    for s in range(stages):
        sched = schedule_cls(micro_batches, stages, s)
        row = []
        for tick in range(sched.num_ticks()):
            mb, fwd = sched.compute_at(tick)
            if sched._valid_micro_batch(mb):
                row.append((float(tick), float(tick + 1), "F" if fwd else "B", mb))
        rows.append(row)
        span = max(span, sched.num_ticks())
    for row in rows:
        bubbles.append(1 - sum(e - b for b, e, _, _ in row) / span)
    return {"rows": rows, "span": float(span), "unit": "tick", "bubble": bubbles,
            "bubble_fraction": sum(bubbles) / len(bubbles), "expected": (stages - 1) / (micro_batches + stages - 1)}


def gpipe_timeline(stages: int, micro_batches: int) -> dict:
    return schedule_timeline(stages, micro_batches, GPipeSchedule)


def measured_timeline(events_per_stage: list[list[tuple]]) -> dict:
    """``events_per_stage[s]``: that stage's ``engine.timeline`` (name, micro_batch, start, end in perf_counter
    seconds; one clock for processes on one machine). Idle = the batch's span minus the stage's passes."""
    rows = []
    for events in events_per_stage:
        rows.append([(b, e, "F" if name == "ForwardPass" else "B", mb) for name, mb, b, e in events
                     if name in ("ForwardPass", "BackwardPass")])
    start = min(r[0][0] for r in rows if r)
    end = max(r[-1][1] for r in rows if r)
    span = end - start
    rows = [[(b - start, e - start, k, mb) for b, e, k, mb in row] for row in rows]
    bubbles = [1 - sum(e - b for b, e, _, _ in row) / span for row in rows]
    stages = len(rows)
    micro = 1 + max((mb for row in rows for *_, mb in row), default=0)
    return {"rows": rows, "span": span, "unit": "s", "bubble": bubbles, "bubble_fraction": sum(bubbles) / stages,
            "expected": (stages - 1) / (micro + stages - 1)}


def render_svg(timeline: dict, title: str = "", width: int = 900, row_height: int = 34) -> str:
    """The timeline as an SVG document (a string; write it to a ``.svg`` file)."""
    rows, span = timeline["rows"], timeline["span"]
    left, top = 70, 40 if title else 14
    scale = (width - left - 10) / span
    height = top + row_height * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>']
    if title:
        out.append(f'<text x="{left}" y="22" font-size="14">{title}</text>')
    for s, row in enumerate(rows):
        y = top + s * row_height
        out.append(f'<text x="8" y="{y + row_height * 0.62:.1f}">stage {s}</text>')
        out.append(f'<rect x="{left}" y="{y + 2}" width="{span * scale:.1f}" height="{row_height - 4}" '
                   'fill="#eeeeee"/>')
        for b, e, kind, mb in row:
            x, w = left + b * scale, max((e - b) * scale, 0.5)
            out.append(f'<rect x="{x:.1f}" y="{y + 2}" width="{w:.1f}" height="{row_height - 4}" '
                       f'fill="{_COLOURS[kind]}" stroke="white" stroke-width="0.5"/>')
            if w > 14:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + row_height * 0.62:.1f}" fill="white" '
                           f'text-anchor="middle">{mb}</text>')
    y = top + row_height * len(rows) + 22
    bubble = timeline["bubble_fraction"]
    out.append(f'<rect x="{left}" y="{y - 10}" width="12" height="12" fill="{_COLOURS["F"]}"/>'
               f'<text x="{left + 16}" y="{y}">forward</text>'
               f'<rect x="{left + 90}" y="{y - 10}" width="12" height="12" fill="{_COLOURS["B"]}"/>'
               f'<text x="{left + 106}" y="{y}">backward</text>'
               f'<text x="{left + 200}" y="{y}">idle (grey) {100 * bubble:.1f}% per stage; (p-1)/(m+p-1) = '
               f'{100 * timeline["expected"]:.1f}%</text>')
    out.append("</svg>")
    return "\n".join(out)
