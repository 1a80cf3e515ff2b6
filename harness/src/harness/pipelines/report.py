"""What ``train-then-serve`` shows: the loss curve in the terminal and as a PNG, and the summary table."""

from __future__ import annotations

import logging
import math
from pathlib import Path

logger = logging.getLogger(__name__)


def ascii_plot(values: list[float], width: int = 60, height: int = 12, title: str = "training loss") -> str:
    """A terminal line chart of ``values`` (resampled to ``width`` columns)."""
    if not values:
        return f"{title}: (no values)"
    cols = [values[min(len(values) - 1, int(i * len(values) / width))] for i in range(min(width, len(values)))]
    lo, hi = min(cols), max(cols)
    span = (hi - lo) or 1.0
    grid = [[" "] * len(cols) for _ in range(height)]
    for x, v in enumerate(cols):
        grid[height - 1 - round((v - lo) / span * (height - 1))][x] = "*"
    lines = [f"{title} (steps 1-{len(values)})"]
    for r, row in enumerate(grid):
        label = hi - r * span / (height - 1)
        lines.append(f"{label:8.3f} |" + "".join(row))
    lines.append(" " * 9 + "+" + "-" * len(cols))
    return "\n".join(lines)


def save_loss_png(values: list[float], path: Path, title: str) -> Path | None:
    """The loss curve as a PNG (matplotlib, headless)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - a dependency of the harness
        logger.warning("matplotlib is not installed: no loss_curve.png")
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(1, len(values) + 1), values, lw=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def smoothed(values: list[float], k: int = 10) -> tuple[float, float]:
    """Mean of the first and the last ``k`` values (single-step losses are noisy)."""
    k = max(1, min(k, len(values) // 3 or 1))
    return sum(values[:k]) / k, sum(values[-k:]) / k


def summary_table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * (max(len(v) for _, v in rows) + 2) + "+"
    out = [line]
    for k, v in rows:
        out.append(f"| {k.ljust(width)} | {v.ljust(len(line) - width - 7)} |")
    out.append(line)
    return "\n".join(out)


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))
