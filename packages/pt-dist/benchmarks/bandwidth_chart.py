"""A dependency-free SVG line chart of algorithm bandwidth against message size, one panel per world size.

The picture nccl-tests users draw from their tables: size on a log axis, GB/s on a linear one, one line per
backend. Written by ``bench_allreduce.py --svg PATH``.
"""

from __future__ import annotations

import math
from html import escape

COLORS = {"gloo": "#6b6b6b", "tcp": "#1f77b4", "shm": "#d62728", "shm-staged": "#ff9896", "shm-symm": "#2ca02c"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 420, 260, 48, 12, 28, 40


def _size_label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def _panel(x0: int, title: str, rows: list[tuple[int, dict]], backends: list[str], top_gbs: float) -> list[str]:
    sizes = [n for n, _ in rows]
    lo, hi = math.log2(sizes[0]), math.log2(sizes[-1])
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(n: int) -> float:
        return x0 + LEFT + (0.5 if hi == lo else (math.log2(n) - lo) / (hi - lo)) * pw

    def py(gbs: float) -> float:
        return TOP + ph - gbs / top_gbs * ph

    out = [f'<text x="{x0 + LEFT + pw / 2:.0f}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{x0 + LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>']
    raw = top_gbs / 6  # about six gridlines, at 1, 2 or 5 x 10^k
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    tick = 0.0
    while tick <= top_gbs + 1e-9:
        out.append(f'<line x1="{x0 + LEFT}" x2="{x0 + LEFT + pw}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" '
                   f'stroke="#eee"/><text x="{x0 + LEFT - 4}" y="{py(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
        tick += step
    for n in sizes:
        out.append(f'<text x="{px(n):.1f}" y="{TOP + ph + 14}" text-anchor="middle">{_size_label(n)}</text>')
    for b in backends:
        pts = [(px(n), py(n / med[b] / 1e9)) for n, med in rows if med.get(b, float("nan")) == med.get(b)]
        if pts:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{COLORS.get(b, "#000")}" stroke-width="2"/>')
    out.append(f'<text x="{x0 + LEFT + pw / 2:.0f}" y="{H - 6}" text-anchor="middle">message size (bytes)</text>')
    return out


def write_svg(path: str, op: str, panels: dict[int, list[tuple[int, dict]]], backends: list[str]) -> None:
    """``panels``: world size -> [(nbytes, {backend: median seconds per call})]."""
    top = max((n / t / 1e9 for rows in panels.values() for n, med in rows for b, t in med.items()
               if b in backends and t == t and t > 0), default=1.0)
    top_gbs = math.ceil(top * 1.1)
    width = W * len(panels) + 110
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" font-family="sans-serif" '
             f'font-size="11"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="12" y="{TOP + (H - TOP - BOTTOM) / 2:.0f}" transform="rotate(-90 12 '
             f'{TOP + (H - TOP - BOTTOM) / 2:.0f})" text-anchor="middle">algbw GB/s</text>']
    for i, (world, rows) in enumerate(sorted(panels.items())):
        parts += _panel(i * W, f"{op}, world {world}", rows, backends, top_gbs)
    for j, b in enumerate(backends):
        y = TOP + 10 + 18 * j
        parts.append(f'<line x1="{W * len(panels) + 4}" x2="{W * len(panels) + 24}" y1="{y}" y2="{y}" '
                     f'stroke="{COLORS.get(b, "#000")}" stroke-width="3"/>'
                     f'<text x="{W * len(panels) + 28}" y="{y + 4}">{escape(b)}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")
