"""The memory timeline of one or more peak reports as a PNG: live bytes per schedule position.

Example:
  >>> import os, tempfile
  >>> from remat_kit.render import plot_timeline
  >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu")
  >>> with tempfile.TemporaryDirectory() as d:
  ...     plot_timeline(r, os.path.join(d, "timeline.png")).name
  'timeline.png'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from remat_kit._units import byte_unit, size
from remat_kit.errors import BadValue
from remat_kit.peak import PeakReport
from remat_kit.render._files import save_figure
from remat_kit.render._front import place_labels
from remat_kit.render._titles import precision_words

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

__all__ = [
    "plot_timeline",
    "timeline_figure",
]

_PHASE_COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}

#: A limit higher than this many times the highest peak would flatten the curves against
#: the bottom: it is named in a note instead of drawn.
_OFF_SCALE = 2.0


def plot_timeline(
    report: PeakReport | Sequence[PeakReport],
    path: str | os.PathLike[str],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    memory_bytes: int | None = None,
    usable_bytes: int | None = None,
    precision: Mapping[str, str] | None = None,
) -> Path:
    """Draws live bytes against schedule position (see :func:`timeline_figure`) as a PNG.

    Args:
      report: one report, or several to overlay (positions scaled to 0..1 then).
      path: the PNG to write (parent directories are created), atomically.
      labels: legend labels (default: ``meta["policy"]`` or the module name).
      title: the run, e.g. ``"llama3-8b b4 s2048 adamw on h100-80gb"``.
      memory_bytes: the device's memory, drawn as a line when given.
      usable_bytes: what a JAX process may allocate (``Target.usable_bytes``), drawn as a
        line when given.
      precision: the run's precision record (default: ``meta["precision"]`` of the first
        report), named in the title.

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
    fig = timeline_figure(
        report,
        labels=labels,
        title=title,
        memory_bytes=memory_bytes,
        usable_bytes=usable_bytes,
        precision=precision,
    )
    return save_figure(fig, path, make_parents=True, dpi=int(fig.dpi))


def timeline_figure(
    report: PeakReport | Sequence[PeakReport],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    memory_bytes: int | None = None,
    usable_bytes: int | None = None,
    precision: Mapping[str, str] | None = None,
) -> Figure:
    """Live bytes against schedule position as a matplotlib figure (Agg canvas, nothing written).

    Phases are shaded when they can be told apart, the peak is marked and labelled inside the
    axes (where the label covers no curve, no other label and no phase name; the axes leave
    room above the highest line for it), and the compiled peak (argument + output + temp -
    alias) is drawn as a dashed line. The device's memory and what a JAX process may allocate
    of it are lines named in the legend with their sizes; one more than twice the highest
    peak is named in a note below the legend rather than drawn. The title names the run, the
    policy (or policies) and the precision.

    Args:
      report: one report, or several to overlay (positions scaled to 0..1 then).
      labels: legend labels (default: ``meta["policy"]`` or the module name).
      title: the run, the title's first line (default: the target).
      memory_bytes: the device's memory.
      usable_bytes: what a JAX process may allocate on the device.
      precision: the run's precision record (default: ``meta["precision"]`` of the first
        report).

    Returns:
      The figure, drawn once (its layout is final: the peak labels were placed on it).

    Raises:
      BadValue: no report given.

    Example:
      >>> r = rk.inspect(lambda a: (a @ a) @ a, jnp.ones((64, 64)), target="cpu",
      ...                meta={"policy": "full"})
      >>> timeline_figure(r, title="two matmuls").axes[0].get_title().splitlines()
      ['two matmuls: memory over the step', 'policy full']
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
    if len(names) != len(reports):
        raise BadValue(f"plot_timeline: {len(names)} labels for {len(reports)} reports")
    scale = len(reports) > 1
    fig = Figure(figsize=(10.0, 4.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    fig.subplots_adjust(left=0.07, right=0.72, bottom=0.12, top=0.8)
    top = max(max(r.peak_bytes, r.live_peak_bytes, *r.timeline) for r in reports)
    limits = [
        (name, value, color)
        for name, value, color in (
            ("device memory", memory_bytes, "red"),
            ("usable by JAX", usable_bytes, "darkred"),
        )
        if value
    ]
    drawn = [lim for lim in limits if lim[1] <= _OFF_SCALE * top]
    # The axis in the unit of the highest line drawn (a tiny step reads in MiB, not 0.00 GiB).
    unit = byte_unit([top, *(v for _, v, _ in drawn)])
    curves, peaks, peak_texts, colors = [], [], [], []
    for r, name in zip(reports, names, strict=True):
        n = max(len(r.timeline), 1)
        xs = np.arange(len(r.timeline)) / (n - 1 if scale and n > 1 else 1)
        ys = np.asarray(r.timeline, dtype=float) / unit.size
        (line,) = ax.plot(xs, ys, lw=1.2, label=f"{name} (live)")
        px = r.peak_position / (n - 1 if scale and n > 1 else 1)
        ax.plot([px], [r.live_peak_bytes / unit.size], "o", color=line.get_color())
        ax.axhline(
            r.peak_bytes / unit.size,
            ls="--",
            lw=0.8,
            color=line.get_color(),
            label=f"{name} compiled peak {size(r.peak_bytes)}",
        )
        curves.append((xs, ys))
        colors.append(line.get_color())
        peaks.append((px, r.live_peak_bytes / unit.size))
        peak_texts.append(f"peak {size(r.peak_bytes)} ({r.peak_phase})")
    if not scale:
        for p in reports[0].phases:
            ax.axvspan(p.start, p.end + 1, color=_PHASE_COLORS.get(p.name, "#999"), alpha=0.12)
            ax.text(
                (p.start + p.end) / 2,
                0.02,
                p.name,
                transform=ax.get_xaxis_transform(),
                ha="center",
                fontsize=8,
            )
    for name, value, color in drawn:
        style = "-" if name == "device memory" else "-."
        ax.axhline(value / unit.size, color=color, ls=style, lw=0.9, label=f"{name} {size(value)}")
    # Room above the highest line: the peak's label goes there when its sides are taken.
    highest = max([top, *(v for _, v, _ in drawn)])
    ax.set_ylim(0, max(highest / unit.size, 1e-9) * 1.22)
    ax.set_xlabel("schedule position" + (" (fraction)" if scale else ""))
    ax.set_ylabel(f"live {unit.name}")
    ax.set_title(_title(title, reports, names, labels, precision), fontsize=10)
    legend = ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    off_scale = [lim for lim in limits if lim not in drawn]
    if off_scale:
        box = legend.get_window_extent(renderer).transformed(fig.transFigure.inverted())
        fig.text(
            box.x0,
            box.y0 - 0.02,
            "\n".join(f"off scale: {n} {size(v)}" for n, v, _ in off_scale),
            fontsize=8,
            va="top",
        )
    curve_boxes = [b for xs, ys in curves for b in _curve_boxes(ax, xs, ys)]
    placed = place_labels(
        ax,
        peaks,
        peak_texts,
        avoid=[t.get_window_extent(renderer) for t in ax.texts] + curve_boxes,
        marker_px=5.0,
        fontsize=8,
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8},
    )
    for label, color in zip(placed, colors, strict=True):
        label.set_color(color)  # each peak's label in its curve's colour
    return fig


def _curve_boxes(ax: Axes, xs: np.ndarray, ys: np.ndarray, px: float = 4.0) -> list[Bbox]:
    # A curve as boxes (display pixels) no label may cover: one per ``px`` pixels of width,
    # as tall as the curve runs there, each reaching to the next one's first point so the
    # segment between them is covered too.
    from matplotlib.transforms import Bbox

    if not len(xs):
        return []
    pts = ax.transData.transform(np.column_stack([xs, ys]))
    bins = ((pts[:, 0] - pts[0, 0]) // px).astype(int)
    starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
    ends = np.r_[starts[1:], len(pts) - 1]
    lo = np.minimum(np.minimum.reduceat(pts[:, 1], starts), pts[ends, 1])
    hi = np.maximum(np.maximum.reduceat(pts[:, 1], starts), pts[ends, 1])
    return [
        Bbox.from_extents(x0 - 1, y0 - 1, x1 + 1, y1 + 1)
        for x0, y0, x1, y1 in zip(pts[starts, 0], lo, pts[ends, 0], hi, strict=True)
    ]


def _title(
    run: str | None,
    reports: Sequence[PeakReport],
    names: Sequence[str],
    labels: Sequence[str] | None,
    precision: Mapping[str, str] | None,
) -> str:
    lines = [
        f"{run}: memory over the step" if run else f"memory over the step ({reports[0].target})"
    ]
    # The policy as the report names it; the caller's labels where it does not.
    policies = [
        str(r.meta.get("policy") or (name if labels is not None else ""))
        for r, name in zip(reports, names, strict=True)
    ]
    if any(policies):
        policies = [p or "-" for p in policies]
        lines.append(f"polic{'y' if len(policies) == 1 else 'ies'} {', '.join(policies)}")
    words = precision_words(
        precision if precision is not None else reports[0].meta.get("precision")
    )
    if words:
        lines.append(words)
    return "\n".join(lines)
