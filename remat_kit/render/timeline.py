"""The memory timeline of one or more peak reports as a PNG: live bytes per schedule position.

Example:
  >>> import os, tempfile
  >>> from remat_kit.render.timeline import plot_timeline
  >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
  >>> with tempfile.TemporaryDirectory() as d:
  ...     plot_timeline(r, os.path.join(d, "timeline.png")).name
  'timeline.png'
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from remat_kit.errors import BadValue
from remat_kit.peak.types import PeakReport
from remat_kit.render.files import save_figure

__all__ = [
    "plot_timeline",
]

_PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}


def plot_timeline(
    report: PeakReport | Sequence[PeakReport],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    memory_bytes: int | None = None,
) -> Path:
    """Draws live bytes against schedule position as a PNG (matplotlib, Agg canvas).

    Phases are shaded when they can be told apart, the peak is marked, and the
    compiled peak (argument + output + temp - alias) is drawn as a dashed line.

    Args:
      report: one report, or several to overlay (positions scaled to 0..1 then).
      path: the PNG to write (parent directories are created), atomically.
      labels: legend labels (default: ``meta["policy"]`` or the module name).
      title: the plot title.
      memory_bytes: the device's memory, drawn as a line when given.

    Returns:
      The path written.

    Raises:
      BadValue: no report given, or ``path`` cannot be written as a regular file.

    Example:
      >>> import tempfile
      >>> x = jnp.ones((64, 64))
      >>> a = rk.inspect(lambda a: a @ a, x, target="cpu", meta={"policy": "one matmul"})
      >>> b = rk.inspect(lambda a: (a @ a) @ a, x, target="cpu", meta={"policy": "two"})
      >>> with tempfile.TemporaryDirectory() as d:  # the two overlaid, positions scaled
      ...     plot_timeline([a, b], os.path.join(d, "timeline.png")).exists()
      True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    reports = [report] if isinstance(report, PeakReport) else list(report)
    if not reports:
        raise BadValue("plot_timeline needs at least one report")
    names = (
        list(labels)
        if labels is not None
        else [str(r.meta.get("policy") or r.module) for r in reports]
    )
    scale = len(reports) > 1
    fig = Figure(figsize=(9, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    gib = 2**30
    for r, name in zip(reports, names, strict=True):
        n = max(len(r.timeline), 1)
        xs = np.arange(n) / (n - 1 if scale and n > 1 else 1)
        (line,) = ax.plot(xs, np.asarray(r.timeline) / gib, lw=1.2, label=f"{name} (live)")
        px = r.peak_position / (n - 1 if scale and n > 1 else 1)
        ax.plot([px], [r.live_peak_bytes / gib], "o", color=line.get_color())
        ax.axhline(r.peak_bytes / gib, ls="--", lw=0.8, color=line.get_color())
        ax.annotate(
            f"peak {r.peak_bytes / gib:.2f} GiB ({r.peak_phase})",
            (px, r.live_peak_bytes / gib),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    if not scale:
        r = reports[0]
        for p in r.phases:
            ax.axvspan(p.start, p.end + 1, color=_PHASE_COLORS.get(p.name, "#999"), alpha=0.12)
            ax.text(
                (p.start + p.end) / 2,
                0.02,
                p.name,
                transform=ax.get_xaxis_transform(),
                ha="center",
                fontsize=8,
            )
    if memory_bytes:
        ax.axhline(memory_bytes / gib, color="red", lw=0.8, label="device memory")
    ax.set_xlabel("schedule position" + (" (fraction)" if scale else ""))
    ax.set_ylabel("live GiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"memory over the step ({reports[0].target})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return save_figure(fig, path, make_parents=True, dpi=120)
