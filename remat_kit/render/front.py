"""The Pareto front as a PNG: compiled peak against estimated overhead.

The points come from :func:`remat_kit.search.front`; this module only draws them and writes the
file through :func:`remat_kit.render.files.save_figure` (atomic).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from remat_kit.render.files import save_figure
from remat_kit.render.format import GIB

if TYPE_CHECKING:
    from remat_kit.search import FrontPoint

__all__ = [
    "plot_front",
]

_COLORS = {"catalogue": "tab:blue", "schedule": "tab:green", "plan": "tab:red"}


def plot_front(
    points: Sequence[FrontPoint],
    path: str | os.PathLike[str],
    *,
    title: str = "",
    budget_bytes: int | None = None,
    device_bytes: int | None = None,
) -> None:
    """Draws peak memory against overhead, dominated points hollow, the front as a line.

    Args:
      points: FrontPoints (see :func:`remat_kit.search.front`).
      path: where the PNG goes (written atomically; see :func:`save_figure`).
      title: the plot title.
      budget_bytes: draws the budget as a vertical line.
      device_bytes: draws the device memory as a vertical line.

    Raises:
      BadValue: ``path`` is not a writable regular file (see
        :func:`remat_kit.render.files.check_output`).

    Example:
      >>> import tempfile
      >>> from remat_kit.search import FrontPoint, pareto_front
      >>> pts = pareto_front([FrontPoint("none", "catalogue", 40 * 2**30, 0.0, 0.0),
      ...                     FrontPoint("full", "catalogue", 20 * 2**30, 0.33, 0.33)])
      >>> with tempfile.TemporaryDirectory() as d:
      ...     plot_front(pts, os.path.join(d, "front.png"), title="two policies")
      ...     os.path.getsize(os.path.join(d, "front.png")) > 0
      True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for kind, color in _COLORS.items():
        for dominated in (False, True):
            sel = [p for p in points if p.kind == kind and p.dominated == dominated]
            if not sel:
                continue
            ax.scatter(
                [p.peak_bytes / GIB for p in sel],
                [100 * p.overhead for p in sel],
                facecolors="none" if dominated else color,
                edgecolors=color,
                marker="o" if kind != "plan" else "D",
                label=f"{kind}{' (dominated)' if dominated else ''}",
                zorder=3,
            )
    for p in points:
        if math.isfinite(p.overhead):
            ax.annotate(
                p.label,
                (p.peak_bytes / GIB, 100 * p.overhead),
                fontsize=6,
                alpha=0.8,
                xytext=(3, 3),
                textcoords="offset points",
            )
    on = sorted(
        (p for p in points if not p.dominated and math.isfinite(p.overhead)),
        key=lambda p: p.peak_bytes,
    )
    if on:
        ax.step(
            [p.peak_bytes / GIB for p in on],
            [100 * p.overhead for p in on],
            where="post",
            color="gray",
            lw=1,
            zorder=1,
            label="front",
        )
    top = max((p.peak_bytes for p in points), default=0)
    for value, name, style in ((budget_bytes, "budget", "--"), (device_bytes, "device", ":")):
        # A device far beyond every point would squash the plot: leave it out then.
        if value and value <= 1.3 * top:
            ax.axvline(value / GIB, color="black", ls=style, lw=1, label=name)
    ax.set_xlabel("compiled peak (GiB)")
    ax.set_ylabel("estimated overhead (% of step FLOPs)")
    finite = [100 * p.overhead for p in points if math.isfinite(p.overhead)]
    if finite:
        ax.set_ylim(-2, min(max(finite) * 1.1 + 2, 150))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
