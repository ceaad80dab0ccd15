"""The two PNGs the CLI writes (``plan --plot``, ``inspect --plot``), checked by geometry.

Each figure is drawn on matplotlib's Agg canvas and its artists measured in display pixels:
no two labels overlap, no label leaves the axes or reaches the title, the limits are lines at
their values, and the titles name what the run was.
"""

from __future__ import annotations

import itertools
import math

import matplotlib
import numpy as np
import pytest
from matplotlib.text import Text

matplotlib.use("Agg")

from remat_kit.peak import PeakReport, Phase
from remat_kit.render import front_figure, plot_front, plot_timeline, timeline_figure
from remat_kit.search._front import FrontPoint, pareto_front

GIB = 2**30
H100 = 85018542080  # rk.target("h100").memory_bytes
H100_USABLE = 63763906560  # its usable_bytes: JAX's default fraction 0.75
BF16 = {
    "name": "bf16",
    "params": "bfloat16",
    "frozen": "-",
    "grads": "bfloat16",
    "optimizer_state": "bfloat16",
    "compute": "bfloat16",
}


def _crowd(n: int = 20, gib: int = 30) -> list[FrontPoint]:
    # Peaks a few KiB apart, overheads a millionth apart: one spot on any sane axis.
    kinds = ("catalogue", "schedule", "plan")
    return [
        FrontPoint(f"policy-{i}", kinds[i % 3], gib * GIB + 4096 * i, 0.2 + 1e-6 * i, 0.2)
        for i in range(n)
    ]


def _line(n: int = 20) -> list[FrontPoint]:
    # A front of close neighbours: each point a tenth of a GiB and half a percent from the next.
    return [
        FrontPoint(f"plan-{i}", "plan", int((40 + 0.1 * i) * GIB), 0.3 - 0.005 * i, 0.3)
        for i in range(n)
    ]


def _cloud(n: int = 25) -> list[FrontPoint]:
    rng = np.random.default_rng(0)
    return [
        FrontPoint(
            f"p{i} @ every:{i % 4 + 1}",
            "schedule" if i % 2 else "catalogue",
            int((33 + rng.random()) * GIB),
            float(0.2 + 0.02 * rng.random()),
            0.2,
        )
        for i in range(n)
    ]


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _inside(inner, outer) -> bool:
    return (
        inner.x0 >= outer.x0 and inner.x1 <= outer.x1 and inner.y0 >= outer.y0
        and inner.y1 <= outer.y1
    )  # fmt: skip


def _box(t: Text):
    # The text's own box: an Annotation's get_window_extent also spans its leader line.
    return Text.get_window_extent(t)


def _numbers(ax):
    return [t for t in ax.texts if t.get_text().isdigit()]


@pytest.mark.slow
@pytest.mark.parametrize("make", [_crowd, _line, _cloud], ids=["crowd", "line", "cloud"])
@pytest.mark.parametrize("usable", [None, 30 * GIB + 2**20], ids=["no-limit", "limit-at-crowd"])
def test_front_labels_never_overlap(make, usable):
    points = pareto_front(make())
    fig = front_figure(points, title="crowded", usable_bytes=usable, device_bytes=usable)
    ax = fig.axes[0]
    fig.canvas.draw()
    boxes = [_box(t) for t in ax.texts]
    assert len(_numbers(ax)) == len(points)
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        assert not _overlap(a, b), (ax.texts[i].get_text(), ax.texts[j].get_text())
    for i, t in enumerate(ax.texts):
        if getattr(t, "arrow_patch", None) is None:
            continue
        # A leader line runs from the marker to its number across no other label.
        (x, y), box = ax.transData.transform(t.xy), boxes[i]
        path = np.linspace([x, y], [(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2], 60)
        for j, other in enumerate(boxes):
            if j != i:
                assert not any(other.contains(*p) for p in path), (t.get_text(), j)
    frame = ax.get_window_extent()
    markers = ax.transData.transform([(p.peak_bytes / GIB, 100 * p.overhead) for p in points])
    for t in _numbers(ax):
        box = _box(t)
        assert _inside(box, frame), t.get_text()
        # A number covers no marker, and sits near its own (a leader line joins them).
        assert not any(box.contains(x, y) for x, y in markers), t.get_text()
        x, y = ax.transData.transform(t.xy)
        assert math.hypot(box.x0 / 2 + box.x1 / 2 - x, box.y0 / 2 + box.y1 / 2 - y) < 150


def test_front_numbers_match_the_key():
    # Number k marks the k-th smallest peak, and the key's line k names that point.
    points = pareto_front(_cloud(12))
    fig = front_figure(points)
    ax = fig.axes[0]
    ordered = sorted(points, key=lambda p: p.peak_bytes)
    for t in _numbers(ax):
        p = ordered[int(t.get_text()) - 1]
        assert t.xy == pytest.approx((p.peak_bytes / GIB, 100 * p.overhead))
    (key,) = [t.get_text() for t in fig.texts if "Pareto" in t.get_text()]
    rows = key.splitlines()[1:-1]
    assert [r.split()[0] for r in rows] == [str(i) for i in range(1, 13)]
    for row, p in zip(rows, ordered, strict=True):
        assert p.label in row
        assert ("*" in row.split(p.label)[0]) == (not p.dominated)


@pytest.mark.parametrize(
    ("budget", "names"),
    [
        (None, {"usable by JAX", "device memory"}),
        (50 * GIB, {"budget", "usable by JAX", "device memory"}),
        (H100_USABLE, {"usable by JAX = budget", "device memory"}),
    ],
    ids=["no-budget", "budget", "budget-is-usable"],
)
def test_front_draws_each_limit_at_its_value(budget, names):
    points = pareto_front([*_line(), FrontPoint("none", "catalogue", 70 * GIB, 0.0, 0.0)])
    fig = front_figure(
        points, budget_bytes=budget, usable_bytes=H100_USABLE, device_bytes=H100, title="run"
    )
    ax = fig.axes[0]
    values = {"budget": budget, "usable by JAX": H100_USABLE, "device memory": H100}
    values["usable by JAX = budget"] = H100_USABLE
    vertical = {
        line.get_label().rsplit(" ", 2)[0]: line
        for line in ax.lines
        if len(set(line.get_xdata())) == 1 and line.get_label().endswith("GiB")
    }
    assert set(vertical) == names
    for name, line in vertical.items():
        assert list(line.get_xdata()) == pytest.approx([values[name] / GIB] * 2)
        assert line.get_label() == f"{name} {values[name] / GIB:.2f} GiB"
        # Named beside the line too, not only in the legend.
        assert any(t.get_text().strip() == line.get_label() for t in ax.texts)
    lo, hi = ax.get_xlim()
    assert all(lo < values[n] / GIB < hi for n in names)


def test_front_names_an_off_scale_limit_instead_of_squashing():
    points = pareto_front(_crowd(gib=20))  # all at 20 GiB; the card is 79 GiB
    fig = front_figure(points, usable_bytes=H100_USABLE, device_bytes=H100, budget_bytes=21 * GIB)
    ax = fig.axes[0]
    xs = {float(line.get_xdata()[0]) for line in ax.lines if len(set(line.get_xdata())) == 1}
    assert sorted(xs) == pytest.approx([21.0])
    assert ax.get_xlim()[1] < 25
    key = "\n".join(t.get_text() for t in fig.texts)
    assert "off scale: usable by JAX 59.38 GiB" in key
    assert "off scale: device memory 79.18 GiB" in key


def test_front_title_names_run_search_and_precision():
    points = pareto_front([*_crowd(7), FrontPoint("none", "catalogue", 40 * GIB, 0.0, 0.0)])
    fig = front_figure(points, title="llama3-8b b4 s2048 sgd on h100", precision=BF16)
    title = fig.axes[0].get_title(loc="left")
    assert title.startswith("llama3-8b b4 s2048 sgd on h100")
    assert "searched: 4 catalogue policies, 2 segment schedules, 2 plans" in title
    assert "precision bf16: weights bf16" in title
    assert "bf16" not in front_figure(points, title="x").axes[0].get_title(loc="left")


@pytest.mark.parametrize(
    ("objective", "unit"),
    [("time", "% of step time"), ("flops", "% of step FLOPs"), (None, "% of the step")],
)
def test_front_overhead_axis_names_the_objective(objective, unit):
    fig = front_figure(pareto_front(_line(3)), objective=objective)
    assert fig.axes[0].get_ylabel() == f"estimated overhead ({unit})"


@pytest.mark.slow
def test_plot_front_writes_a_png(tmp_path):
    path = plot_front(
        pareto_front(_cloud()),
        tmp_path / "front.png",
        title="run",
        budget_bytes=33 * GIB,
        usable_bytes=34 * GIB,
        device_bytes=45 * GIB,
        precision=BF16,
    )
    assert path == tmp_path / "front.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _report(
    timeline: list[float], *, policy: str | None = "minimal", meta: dict | None = None
) -> PeakReport:
    # A synthetic report: ``timeline`` in GiB, forward / backward / optimizer in thirds.
    live = [int(v * GIB) for v in timeline]
    n, pos = len(live), int(np.argmax(live))
    third = max(n // 3, 1)
    phases = (
        Phase("forward", 0, third - 1),
        Phase("backward", third, 2 * third - 1),
        Phase("optimizer", 2 * third, n - 1),
    )
    return PeakReport(
        target="h100-80gb",
        peak_bytes=int(max(live) * 1.02),
        live_peak_bytes=max(live),
        fragmentation_bytes=int(max(live) * 0.02),
        peak_position=pos,
        peak_instruction="fusion.1",
        peak_op_name="jit(step)/dot_general",
        peak_phase=next(p.name for p in phases if p.start <= pos <= p.end),
        schedule_length=n,
        argument_bytes=0,
        output_bytes=0,
        temp_bytes=0,
        alias_bytes=0,
        xla_peak_bytes=None,
        xla_live_peak_bytes=None,
        buffers=(),
        by_category={},
        by_layer={},
        timeline=tuple(live),
        phases=phases,
        module="jit_step",
        jax_version="0.0",
        compile_seconds=0.0,
        parse_seconds=0.0,
        meta={**({"policy": policy} if policy else {}), **(meta or {})},
    )


_RAMP = list(np.linspace(10, 40, 60)) + list(np.linspace(40, 15, 60)) + [15.0] * 60


def _peak_labels(ax):
    return [t for t in ax.texts if t.get_text().startswith("peak ")]


@pytest.mark.parametrize(
    ("timelines", "memory", "usable"),
    [
        ([_RAMP], None, None),
        ([_RAMP], H100, H100_USABLE),
        ([[1.0] * 99 + [60.0]], H100, H100_USABLE),  # the peak at the last position, at the top
        ([[60.0] + [1.0] * 99], None, H100_USABLE),  # at the first, level with the usable line
        ([[5.0] * 30 + [59.0] * 3 + [5.0] * 30], None, 59 * GIB),  # a spike at the limit
        ([_RAMP, [v * 0.98 for v in _RAMP]], H100, H100_USABLE),  # two peaks side by side
    ],
    ids=["ramp", "ramp-limits", "last", "first", "spike", "two"],
)
def test_timeline_peak_label_inside_axes_clear_of_title(timelines, memory, usable):
    reports = [_report(t, policy=f"policy-{i}") for i, t in enumerate(timelines)]
    fig = timeline_figure(
        reports if len(reports) > 1 else reports[0],
        title="llama3-8b b4 s2048 adamw on h100-80gb",
        memory_bytes=memory,
        usable_bytes=usable,
        precision=BF16,
    )
    ax = fig.axes[0]
    fig.canvas.draw()
    title = ax.title.get_window_extent()
    frame = ax.get_window_extent()
    labels = _peak_labels(ax)
    assert len(labels) == len(reports)
    for t in labels:
        box = _box(t)
        assert not _overlap(box, title), t.get_text()
        assert _inside(box, frame), t.get_text()
    boxes = [_box(t) for t in ax.texts]  # the phase names too
    for a, b in itertools.combinations(boxes, 2):
        assert not _overlap(a, b)


@pytest.mark.parametrize(
    ("memory", "usable"), [(H100, H100_USABLE), (None, H100_USABLE), (H100, None)]
)
def test_timeline_draws_limits_as_horizontal_lines(memory, usable):
    fig = timeline_figure(_report([40.0, 55.0, 50.0]), memory_bytes=memory, usable_bytes=usable)
    ax = fig.axes[0]
    flat = {
        line.get_label(): float(line.get_ydata()[0])
        for line in ax.lines
        if len(set(line.get_ydata())) == 1 and not line.get_label().startswith("_")
    }
    want = {}
    if usable:
        want[f"usable by JAX {usable / GIB:.2f} GiB"] = usable / GIB
    if memory:
        want[f"device memory {memory / GIB:.2f} GiB"] = memory / GIB
    assert {k: v for k, v in flat.items() if "compiled peak" not in k} == pytest.approx(want)
    assert ax.get_ylim()[1] > max(want.values())


def test_timeline_names_an_off_scale_limit_instead_of_flattening():
    fig = timeline_figure(_report([0.1, 0.4, 0.2]), memory_bytes=H100, usable_bytes=H100_USABLE)
    ax = fig.axes[0]
    assert not any("usable" in line.get_label() for line in ax.lines)
    # The peak (0.4 GiB) sets the axis, in the unit that suits it: MiB, under 1024 of them.
    assert ax.get_ylabel() == "live MiB" and 0.4 * 1024 < ax.get_ylim()[1] < 1024
    notes = "\n".join(t.get_text() for t in fig.texts)
    assert "off scale: usable by JAX 59.38 GiB" in notes


@pytest.mark.parametrize(
    ("reports", "kwargs", "words"),
    [
        ([_report(_RAMP)], {"precision": BF16}, ["policy minimal", "precision bf16"]),
        ([_report(_RAMP, meta={"precision": BF16})], {}, ["policy minimal", "precision bf16"]),
        (
            [_report(_RAMP, policy=None), _report(_RAMP, policy=None)],
            {"labels": ["full", "none"], "precision": BF16},
            ["policies full, none", "precision bf16"],
        ),
    ],
    ids=["given", "from-meta", "from-labels"],
)
def test_timeline_title_names_policy_and_precision(reports, kwargs, words):
    fig = timeline_figure(reports, title="llama3-8b b4 s2048 adamw on h100-80gb", **kwargs)
    title = fig.axes[0].get_title()
    assert title.startswith("llama3-8b b4 s2048 adamw on h100-80gb")
    for w in words:
        assert w in title


def test_plot_timeline_writes_a_png(tmp_path):
    path = plot_timeline(
        _report(_RAMP),
        tmp_path / "deep" / "timeline.png",
        memory_bytes=H100,
        usable_bytes=H100_USABLE,
        precision=BF16,
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
