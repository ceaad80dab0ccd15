"""The Pareto front as a PNG: compiled peak against estimated overhead.

The points come from :func:`remat_kit.search._front`; this module only draws them and writes the
file through :func:`remat_kit.render.save_figure` (atomic). Each point is numbered (by
peak, smallest first) next to its marker, and a key beside the axes names it: a front has 10
to 25 points, many of them within a fraction of a GiB of each other, so their names never fit
beside the markers. :func:`place_labels` puts the numbers where they overprint nothing.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from remat_kit._units import Unit, byte_unit, pct, size
from remat_kit.render._files import save_figure
from remat_kit.render._format import short
from remat_kit.render._titles import precision_words

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation

    from remat_kit.search import FrontPoint

__all__ = [
    "front_figure",
    "named_points",
    "place_labels",
    "plot_front",
]

_COLORS = {"catalogue": "tab:blue", "schedule": "tab:green", "plan": "tab:red"}
_KINDS = {"catalogue": "catalogue policy", "schedule": "segment schedule", "plan": "plan"}
_OBJECTIVES = {"time": "step time", "flops": "step FLOPs"}
_PLURAL = {"catalogue": "catalogue policies", "schedule": "segment schedules", "plan": "plans"}

#: A limit further right than this many times the largest peak would squash the points
#: against the left edge: it is named in a note instead of drawn.
_OFF_SCALE = 2.0

#: How far, in pixels, a text may sit from its marker (further, it goes where it covers least).
_REACH = 300.0

#: The key's label column, in characters (longer labels are cut with an ellipsis).
_KEY_LABEL = 30


def plot_front(
    points: Sequence[FrontPoint],
    path: str | os.PathLike[str],
    *,
    title: str = "",
    budget_bytes: int | None = None,
    device_bytes: int | None = None,
    usable_bytes: int | None = None,
    precision: Mapping[str, str] | None = None,
    objective: str | None = None,
) -> Path:
    """Draws peak memory against overhead (see :func:`front_figure`) and writes it as a PNG.

    Args:
      points: FrontPoints (see :func:`remat_kit.search._front`).
      path: where the PNG goes (written atomically; see :func:`save_figure`).
      title: the run, e.g. ``"llama3-8b b4 s2048 sgd on h100-80gb"``.
      budget_bytes: the budget the plan was made for, drawn as a vertical line.
      device_bytes: the card's memory, drawn as a vertical line.
      usable_bytes: what a JAX process may allocate (``Target.usable_bytes``), the limit
        "fits" is judged against, drawn as a vertical line.
      precision: the run's precision record (``Options.precision_record()``), named in the
        title.
      objective: what the overhead is (``time`` or ``flops``, as the plan was made for), named
        on the overhead axis; None: not named.

    Returns:
      The path written.

    Raises:
      BadValue: ``path`` is not a writable regular file (see
        :func:`remat_kit.render.check_output`).

    Example:
      >>> import tempfile
      >>> from remat_kit.search import FrontPoint, pareto_front
      >>> pts = pareto_front([FrontPoint("none", "catalogue", 40 * 2**30, 0.0, 0.0),
      ...                     FrontPoint("full", "catalogue", 20 * 2**30, 0.33, 0.33)])
      >>> with tempfile.TemporaryDirectory() as d:
      ...     plot_front(pts, os.path.join(d, "front.png"), title="two policies").stat().st_size > 0
      True
    """
    fig = front_figure(
        points,
        title=title,
        budget_bytes=budget_bytes,
        device_bytes=device_bytes,
        usable_bytes=usable_bytes,
        precision=precision,
        objective=objective,
    )
    return save_figure(fig, path, dpi=int(fig.dpi))


def named_points(points: Iterable[FrontPoint]) -> tuple[FrontPoint, ...]:
    """``points`` with each key in words: a plan's key (``plan:1073741824``, its budget in
    bytes: data, from :mod:`remat_kit.search`) becomes ``plan (budget 1.00 GiB)`` wherever it
    stands (``label``, ``same_as``, ``dominated_by``); the other keys are their own words.

    Two plans whose budgets read alike keep their keys apart: each is named ``#2``, ``#3`` ...
    after the first, in the order given, so no row points at the wrong one.

    Example:
      >>> from remat_kit.search import FrontPoint
      >>> key = "plan:1073741824"
      >>> pts = named_points([FrontPoint(key, "plan", 1, 0.0, 0.0, budget_bytes=2**30),
      ...                     FrontPoint("full", "catalogue", 1, 0.0, 0.0, same_as=key)])
      >>> [(p.label, p.same_as) for p in pts]
      [('plan (budget 1.00 GiB)', None), ('full', 'plan (budget 1.00 GiB)')]
    """
    points = tuple(points)
    words: dict[str, str] = {}
    for p in points:
        if p.kind == "plan" and p.budget_bytes is not None and p.label not in words:
            said = f"plan (budget {size(p.budget_bytes)})"
            n = sum(w.startswith(said) for w in words.values())
            words[p.label] = said if n == 0 else f"{said} #{n + 1}"

    def named(key: str | None) -> str | None:
        return None if key is None else words.get(key, key)

    return tuple(
        dataclasses.replace(
            p, label=named(p.label), same_as=named(p.same_as), dominated_by=named(p.dominated_by)
        )
        for p in points
    )


def front_figure(
    points: Sequence[FrontPoint],
    *,
    title: str = "",
    budget_bytes: int | None = None,
    device_bytes: int | None = None,
    usable_bytes: int | None = None,
    precision: Mapping[str, str] | None = None,
    objective: str | None = None,
) -> Figure:
    """Peak memory against overhead as a matplotlib figure (Agg canvas, nothing written).

    Dominated points are hollow, the front is a step line. Every point is numbered next to its
    marker, where the number overprints no other number, marker or line label; the key beside
    the axes gives each number's label, peak and overhead. The limits are vertical lines, each
    named with its size: the card's memory, what a JAX process may allocate of it (what "fits"
    means) and the plan's budget (one line when the budget is the usable limit). A limit more
    than twice the largest peak is named in a note rather than drawn. The title names the run,
    what was searched (how many policies, schedules and plans) and the precision.

    Args:
      points: FrontPoints (see :func:`remat_kit.search._front`).
      title: the run, the title's first line.
      budget_bytes: the plan's budget.
      device_bytes: the card's memory.
      usable_bytes: what a JAX process may allocate on the card.
      precision: the run's precision record, or None.
      objective: what the overhead is: ``time`` or ``flops``, or None.

    Returns:
      The figure, drawn once (its layout is final: the labels were placed on it).

    Example:
      >>> from remat_kit.search import FrontPoint
      >>> fig = front_figure([FrontPoint("none", "catalogue", 40 * 2**30, 0.0, 0.0)],
      ...                    title="one policy", usable_bytes=59 * 2**30)
      >>> [t.get_text() for t in fig.axes[0].texts]
      ['usable by JAX 59.00 GiB', '1']
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from remat_kit.search import merged

    # One marker per program: policies that lower alike share it (``dots = minimal``).
    ordered = sorted(
        merged(named_points(points)), key=lambda p: (p.peak_bytes, p.overhead, p.label)
    )
    shown = [(i, p) for i, p in enumerate(ordered, 1) if math.isfinite(p.overhead)]
    # The key needs a line per point below the legend: a long front makes a taller figure.
    height = max(5.0, 2.9 + 0.12 * (len(ordered) + 2))
    fig = Figure(figsize=(11.0, height), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    fig.subplots_adjust(left=0.07, right=0.6, bottom=0.5 / height, top=1 - 0.85 / height)

    top = max((p.peak_bytes for _, p in shown), default=0)
    drawn, off_scale = _limits(budget_bytes, usable_bytes, device_bytes, top)
    # The axis in the unit of the largest figure drawn (a tiny model's front reads in MiB).
    unit = byte_unit([top, *(v for _, v, _ in drawn)])
    for kind, color in _COLORS.items():
        for dominated in (False, True):
            sel = [p for _, p in shown if p.kind == kind and p.dominated == dominated]
            if not sel:
                continue
            ax.scatter(
                [p.peak_bytes / unit.size for p in sel],
                [100 * p.overhead for p in sel],
                facecolors="none" if dominated else color,
                edgecolors=color,
                marker="o" if kind != "plan" else "D",
                label=f"{_KINDS.get(kind, kind)}{' (dominated)' if dominated else ''}",
                zorder=3,
            )
    on = sorted((p for _, p in shown if not p.dominated), key=lambda p: p.peak_bytes)
    if on:
        ax.step(
            [p.peak_bytes / unit.size for p in on],
            [100 * p.overhead for p in on],
            where="post",
            color="gray",
            lw=1,
            zorder=1,
            label="Pareto front",
        )

    xs = [p.peak_bytes / unit.size for _, p in shown] + [v / unit.size for _, v, _ in drawn]
    if xs:
        lo, hi = min(xs), max(xs)
        pad = 0.06 * (hi - lo) if hi > lo else max(0.05 * hi, 0.5)
        ax.set_xlim(lo - pad, hi + pad)
    finite = [100 * p.overhead for _, p in shown]
    if finite:
        # Headroom above the highest point: its number goes there when its sides are taken.
        ax.set_ylim(min(-2.0, min(finite) - 2), min(max(finite) * 1.15 + 4, 150))
    markers = [(p.peak_bytes / unit.size, 100 * p.overhead) for _, p in shown]
    walls = []
    for name, value, style in drawn:
        walls.append(
            ax.axvline(
                value / unit.size, color="black", ls=style, lw=1, label=f"{name} {size(value)}"
            )
        )
        _name_line(ax, value / unit.size, f"{name} {size(value)}", markers)

    ax.set_xlabel(f"compiled peak ({unit.name})")
    ax.set_ylabel(f"estimated overhead (% of {_OBJECTIVES.get(objective or '', 'the step')})")
    ax.set_title(_title(title, points, precision), loc="left", fontsize=9)
    corner = ax.get_position()
    key_x, key_y = corner.x1 + 0.02 * corner.width, corner.y1
    if ax.get_legend_handles_labels()[0]:
        legend = ax.legend(
            fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0
        )
        fig.canvas.draw()
        box = legend.get_window_extent().transformed(fig.transFigure.inverted())
        key_x, key_y = box.x0, box.y0 - 0.02
    else:
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    fig.text(
        key_x,
        key_y,
        _key(ordered, off_scale, unit),
        family="monospace",
        fontsize=7,
        va="top",
        ha="left",
    )
    place_labels(
        ax,
        markers,
        [str(i) for i, _ in shown],
        # The limits' names, and the limit lines themselves: no number sits across a limit.
        avoid=[t.get_window_extent(renderer) for t in ax.texts]
        + [line.get_window_extent(renderer).padded(2) for line in walls],
        fontsize=7,
    )
    return fig


def _name_line(ax: Axes, x: float, text: str, markers: Sequence[tuple[float, float]]) -> None:
    # The name of a vertical line, written along it: at its top or bottom, on its left or
    # right, wherever it is furthest from the points (fewest markers near its box).
    from matplotlib.transforms import ScaledTranslation

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    xy = ax.transData.transform(np.asarray(markers, dtype=float).reshape(-1, 2))
    best = None
    for y, va in ((0.99, "top"), (0.01, "bottom")):
        for dx, ha in ((-2, "right"), (2, "left")):
            shift = ScaledTranslation(dx / 72, 0, fig.dpi_scale_trans)
            t = ax.text(
                x,
                y,
                text,
                transform=ax.get_xaxis_transform() + shift,
                rotation=90,
                ha=ha,
                va=va,
                fontsize=7,
            )
            box = t.get_window_extent(renderer).padded(12)
            near = sum(box.contains(px, py) for px, py in xy)
            if best is None or near < best[0]:
                if best is not None:
                    best[1].remove()
                best = (near, t)
            else:
                t.remove()


def place_labels(
    ax: Axes,
    anchors: Sequence[tuple[float, float]],
    texts: Sequence[str],
    *,
    avoid: Iterable[Any] = (),
    marker_px: float = 7.0,
    **text_kwargs: Any,
) -> list[Annotation]:
    """Annotates each anchor with its text where no two texts and no marker overlap.

    Greedy, in display coordinates. Each text, the most crowded anchors first, takes the
    nearest of the positions on rings around its anchor (up to 300 pixels out, upper right
    first)
    whose box lies inside the axes and covers no other text, no marker, no leader line and
    nothing in ``avoid``. A text away from its marker gets a thin leader line, which crosses
    no other text: where every free position's would (an anchor boxed in by its neighbours'
    texts), the texts in the way are taken off and placed again after it (a bounded number of
    times). Call it once the axes' limits and the figure's layout are final: the boxes are in
    pixels of the layout they were placed on (offsets are in points, so a change of dpi keeps
    them apart).

    Args:
      ax: the axes, its limits set, on a canvas with a renderer (Agg).
      anchors: the points labelled, in data coordinates (one per text).
      texts: the labels.
      avoid: boxes (``matplotlib.transforms.Bbox``, display coordinates) no text may cover
        and no leader line cross.
      marker_px: half the size of a marker's box, in pixels.
      **text_kwargs: passed to ``ax.annotate`` (``fontsize``, ``color``, ...).

    Returns:
      The annotations, in the order of ``texts``.

    Raises:
      ValueError: ``anchors`` and ``texts`` differ in length.

    Example:
      >>> from matplotlib.backends.backend_agg import FigureCanvasAgg
      >>> from matplotlib.figure import Figure
      >>> ax = FigureCanvasAgg(Figure()).figure.add_subplot()
      >>> labels = place_labels(ax, [(0.5, 0.5)] * 3, ["a", "b", "c"])  # one spot, three texts
      >>> len({a.xyann for a in labels})
      3
    """
    if len(anchors) != len(texts):
        raise ValueError(f"place_labels: {len(anchors)} anchors for {len(texts)} texts")
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    xy = ax.transData.transform(np.asarray(anchors, dtype=float).reshape(-1, 2))
    inside = (
        (xy[:, 0] >= frame.x0)
        & (xy[:, 0] <= frame.x1)
        & (xy[:, 1] >= frame.y0)
        & (xy[:, 1] <= frame.y1)
    )
    space = _Space(
        frame=(frame.x0 + 2, frame.y0 + 2, frame.x1 - 2, frame.y1 - 2),
        fixed=np.array([(b.x0, b.y0, b.x1, b.y1) for b in avoid], dtype=float).reshape(-1, 4),
        markers=np.column_stack([xy - marker_px, xy + marker_px])[inside],
        marker_px=marker_px,
    )
    queue = [i for i in _crowded_first(xy) if inside[i]]
    repairs = 4 * len(queue)
    while queue:
        i = queue.pop(0)
        probe = ax.text(0, 0, texts[i], **text_kwargs)
        ext = probe.get_window_extent(renderer)
        probe.remove()
        evicted = space.place(i, xy[i], (ext.width / 2 + 1, ext.height / 2 + 1), repairs > 0)
        repairs -= len(evicted)
        queue += evicted
    placed = []
    for i, text in enumerate(texts):
        if i not in space.offsets:
            # Beyond the axes' limits: matplotlib does not draw an annotation of such a point.
            placed.append(ax.annotate(text, tuple(anchors[i]), **text_kwargs))
            continue
        dx, dy = space.offsets[i] * 72.0 / fig.dpi
        placed.append(
            ax.annotate(
                text,
                tuple(anchors[i]),
                xytext=(float(dx), float(dy)),
                textcoords="offset points",
                ha="center",
                va="center",
                arrowprops=(
                    {"arrowstyle": "-", "color": "0.45", "lw": 0.5, "shrinkA": 1, "shrinkB": 3}
                    if i in space.wires
                    else None
                ),
                zorder=4,
                **text_kwargs,
            )
        )
    return placed


class _Space:
    """What :func:`place_labels` has placed so far, in display pixels: boxes are rows of
    ``x0, y0, x1, y1``, leader lines rows of ``x0, y0, x1, y1`` (anchor to box centre)."""

    def __init__(
        self,
        frame: tuple[float, float, float, float],
        fixed: np.ndarray,
        markers: np.ndarray,
        marker_px: float,
    ) -> None:
        self.frame, self.fixed, self.markers, self.marker_px = frame, fixed, markers, marker_px
        self.boxes: dict[int, np.ndarray] = {}
        self.offsets: dict[int, np.ndarray] = {}
        self.wires: dict[int, np.ndarray] = {}
        # Rings 3 pixels apart, positions on each about 6 pixels apart (at least 24), the
        # upper right first: so many directions that a crowd's leader lines find a way out.
        rings = []
        for r in np.arange(marker_px + 3, _REACH, 3.0):
            a = np.deg2rad(45) + np.linspace(0, 2 * np.pi, max(24, int(2 * np.pi * r / 6)), False)
            rings.append(np.column_stack([r * np.cos(a), r * np.sin(a)]))
        self.rings = np.concatenate(rings)

    def place(
        self, i: int, anchor: np.ndarray, half: tuple[float, float], repair: bool
    ) -> list[int]:
        """Places text ``i`` (``half`` its box's half width and height) by ``anchor``.

        Returns:
          The texts taken off to clear its leader line, to be placed again.
        """
        x, y = anchor
        # A ring position is the offset of the box's centre; push it out by the box's own
        # half-size so the nearest ring clears the marker whichever side the box is on.
        off = self.rings + np.sign(self.rings) * half * (np.abs(self.rings) > 1e-9)
        cx, cy = x + off[:, 0], y + off[:, 1]
        boxes = np.column_stack([cx - half[0], cy - half[1], cx + half[0], cy + half[1]])
        x0, y0, x1, y1 = self.frame
        ok = (boxes[:, 0] >= x0) & (boxes[:, 2] <= x1) & (boxes[:, 1] >= y0) & (boxes[:, 3] <= y1)
        ids = list(self.boxes)
        texts = np.array([self.boxes[j] for j in ids]).reshape(-1, 4)
        hits = _overlaps(boxes, np.concatenate([self.markers, self.fixed, texts])).sum(axis=1)
        if self.wires:
            # No box on another text's leader line.
            wires = np.array(list(self.wires.values()))
            n = len(wires)
            hits += _meets(wires[:, :2], wires[:, 2:], np.zeros(n), np.ones(n), boxes).sum(axis=0)
        # A box away from its marker gets a leader line: how far the box's edge is from it.
        gap = np.hypot(
            np.maximum(np.maximum(boxes[:, 0] - x, x - boxes[:, 2]), 0),
            np.maximum(np.maximum(boxes[:, 1] - y, y - boxes[:, 3]), 0),
        )
        far = gap > self.marker_px + 4
        free = np.flatnonzero(ok & (hits == 0))
        if not free.size:
            # Nothing free within the axes (a front of hundreds): the least covered position.
            k, evicted = int(np.argmin(hits + 1000 * ~ok)), []
        else:
            # The nearest free position whose leader line (if it needs one) crosses nothing.
            crossed = _crossed(
                x, y, boxes[free], np.concatenate([self.fixed, texts]), self.marker_px
            )
            crossed &= far[free, None]
            clear = np.flatnonzero(~crossed.any(axis=1))
            if clear.size:
                k, evicted = int(free[clear[0]]), []
            elif repair:
                # Boxed in by its neighbours' texts: the nearest position whose leader crosses
                # no fixed box and the fewest texts; those texts move.
                cost = crossed[:, len(self.fixed) :].sum(axis=1)
                cost = cost + 1000 * crossed[:, : len(self.fixed)].any(axis=1)
                best = int(np.argmin(cost))
                k = int(free[best])
                evicted = [ids[m] for m in np.flatnonzero(crossed[best, len(self.fixed) :])]
            else:
                k, evicted = int(free[0]), []
        for j in evicted:
            del self.boxes[j], self.offsets[j]
            self.wires.pop(j, None)
        self.boxes[i], self.offsets[i] = boxes[k], off[k]
        self.wires.pop(i, None)
        if far[k]:
            self.wires[i] = np.array([x, y, x + off[k][0], y + off[k][1]])
        return evicted


def _crowded_first(xy: np.ndarray, radius: float = 40.0) -> list[int]:
    # The order texts are placed in: the anchor with most neighbours first, and within a
    # crowd its middle first. A text placed late in the middle of a crowd would find every
    # way out taken by its neighbours' texts; placed first, it sits by its marker and the
    # ones around it reach outward past it.
    if not len(xy):
        return []
    d = np.hypot(*(xy[:, None, :] - xy[None, :, :]).transpose(2, 0, 1))
    near = d < radius
    count = near.sum(axis=1)
    centre = np.array([xy[row].mean(axis=0) for row in near])
    spread = np.hypot(*(xy - centre).T)
    return sorted(range(len(xy)), key=lambda i: (-count[i], spread[i], i))


def _crossed(
    x: float, y: float, boxes: np.ndarray, solid: np.ndarray, marker_px: float
) -> np.ndarray:
    # A (K, M) matrix: whether the leader line from (x, y) to the centre of box k crosses
    # solid box m, outside box k itself and the anchor's marker. A solid box the marker
    # itself touches (a limit line through the point) counts as crossed by none.
    out = np.zeros((len(boxes), len(solid)), dtype=bool)
    if not len(boxes) or not len(solid):
        return out
    apart = (
        (solid[:, 0] > x + marker_px)
        | (solid[:, 2] < x - marker_px)
        | (solid[:, 1] > y + marker_px)
        | (solid[:, 3] < y - marker_px)
    )
    start = np.array([x, y])
    centre = np.column_stack([boxes[:, 0] + boxes[:, 2], boxes[:, 1] + boxes[:, 3]]) / 2
    d = np.abs(centre - start)
    with np.errstate(divide="ignore"):
        # The part of the line that counts: out of the marker's square, short of the box.
        leaves = marker_px / np.maximum(d.max(axis=1), 1e-9)
        reaches = 1 - np.minimum(
            (boxes[:, 2] - boxes[:, 0]) / 2 / d[:, 0], (boxes[:, 3] - boxes[:, 1]) / 2 / d[:, 1]
        )
    starts = np.broadcast_to(start, centre.shape)
    out[:, apart] = _meets(starts, centre, leaves, reaches, solid[apart])
    return out


def _meets(
    p0: np.ndarray, p1: np.ndarray, t0: np.ndarray, t1: np.ndarray, boxes: np.ndarray
) -> np.ndarray:
    # A (K, M) matrix: whether the part t0..t1 (fractions) of segment p0 -> p1 (K rows each)
    # passes through the inside of box m (Liang-Barsky clipping).
    enter = np.repeat(np.asarray(t0, dtype=float)[:, None], len(boxes), axis=1)
    leave = np.repeat(np.asarray(t1, dtype=float)[:, None], len(boxes), axis=1)
    d = p1 - p0
    for a in (0, 1):
        lo, hi = boxes[None, :, a], boxes[None, :, a + 2]
        p, v = p0[:, a : a + 1], d[:, a : a + 1]
        flat = np.abs(v) < 1e-12
        with np.errstate(divide="ignore", invalid="ignore"):
            ta, tb = (lo - p) / v, (hi - p) / v
        inside = (p > lo) & (p < hi)
        lo_t = np.where(flat, np.where(inside, -np.inf, np.inf), np.minimum(ta, tb))
        hi_t = np.where(flat, np.where(inside, np.inf, -np.inf), np.maximum(ta, tb))
        enter, leave = np.maximum(enter, lo_t), np.minimum(leave, hi_t)
    return enter < leave


def _overlaps(boxes: np.ndarray, others: np.ndarray) -> np.ndarray:
    # boxes (K, 4) and others (M, 4) as x0, y0, x1, y1: a K x M matrix of "they overlap".
    if not len(others):
        return np.zeros((len(boxes), 0), dtype=bool)
    b, o = boxes[:, None, :], others[None, :, :]
    return (
        (b[..., 0] < o[..., 2])
        & (o[..., 0] < b[..., 2])
        & (b[..., 1] < o[..., 3])
        & (o[..., 1] < b[..., 3])
    )


def _limits(
    budget: int | None, usable: int | None, device: int | None, top: int
) -> tuple[list[tuple[str, int, str]], list[tuple[str, int, str]]]:
    # (name, bytes, line style) of each limit: those drawn, and those too far right to draw.
    limits = []
    if usable and budget == usable:
        limits.append(("usable by JAX = budget", usable, "-"))
    else:
        if budget:
            limits.append(("budget", budget, "--"))
        if usable:
            limits.append(("usable by JAX", usable, "-"))
    if device and device != usable:
        limits.append(("device memory", device, ":"))
    if not top:
        return limits, []
    return (
        [lim for lim in limits if lim[1] <= _OFF_SCALE * top],
        [lim for lim in limits if lim[1] > _OFF_SCALE * top],
    )


def _title(run: str, points: Sequence[FrontPoint], precision: Mapping[str, str] | None) -> str:
    counts = dict.fromkeys(_KINDS, 0)
    for p in points:
        counts[p.kind] = counts.get(p.kind, 0) + 1
    searched = ", ".join(
        f"{n} {(_KINDS if n == 1 else _PLURAL).get(kind, kind)}" for kind, n in counts.items() if n
    )
    lines = [
        f"{run + ': ' if run else ''}compiled peak against overhead",
        f"searched: {searched or 'nothing'}",
    ]
    words = precision_words(precision)
    if words:
        lines.append(words)
    return "\n".join(lines)


def _key(
    points: Sequence[FrontPoint], off_scale: Sequence[tuple[str, int, str]], unit: Unit
) -> str:
    width = len(str(len(points)))
    lines = [f"off scale: {n} {size(v)}" for n, v, _ in off_scale]
    lines += [
        f"{'#':>{width}}   {'point':<{_KEY_LABEL}} {unit.name:>7} {'overhead':>9}",
    ]
    for i, p in enumerate(points, 1):
        mark = " " if p.dominated else "*"
        over = pct(p.overhead) if math.isfinite(p.overhead) else "-"
        lines.append(
            f"{i:>{width}} {mark} {short(p.label, _KEY_LABEL):<{_KEY_LABEL}} "
            f"{unit.cell(p.peak_bytes):>7} {over:>9}"
        )
    lines.append("* on the Pareto front")
    return "\n".join(lines)
