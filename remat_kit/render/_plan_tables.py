"""The ``plan`` tables: the planner's plan beside the catalogue points, and its decisions per
tag. Data in (a Plan, front points), a ``rich.table.Table`` out; nothing here compiles."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table

from remat_kit._units import byte_unit, pct, second_unit, size
from remat_kit.notes import label
from remat_kit.render._captions import depth_words
from remat_kit.render._format import short
from remat_kit.render._front import named_points
from remat_kit.render._tables import _FRONT_WIDTH, _NAME_WIDTH, _YES_NO
from remat_kit.render._timing import step_time_words
from remat_kit.render._titles import RunOptions, opts_precision, run_words, training_line
from remat_kit.render._wrap import cell

if TYPE_CHECKING:
    from remat_kit.search import FrontPoint, Plan
    from remat_kit.targets import Target

__all__ = [
    "decision_table",
    "plan_table",
]


def plan_table(
    p: Plan,
    points: Iterable[FrontPoint],
    target: Target,
    opts: RunOptions,
    *,
    plan_seconds: float,
    seconds: float,
    compiles: int,
) -> Table:
    """The ``plan`` table: the plan beside the catalogue points, with the Pareto front marked.

    Args:
      p: the plan.
      points: the front points compiled beside it (the plan's own point included).
      target: the target compiled for.
      opts: the run's options (for the title).
      plan_seconds: wall time of the planner.
      seconds: wall time of everything.
      compiles: how many programs were compiled in all.

    Returns:
      The table.
    """
    title = (
        f"plan for {run_words(opts)} on {target.label}: "
        f"budget {size(p.budget_bytes)}, attention="
        f"{p.report.attention if p.report is not None else '-'}"
        + training_line(
            opts_precision(opts),
            p.report.meta.dropout if p.report is not None else None,
        )
    )
    if p.host_budget_bytes is not None:
        title += f", host budget {size(p.host_budget_bytes)}"
    caption = (
        f"plan found in {plan_seconds:.1f} s ({p.compiles} compiles); {compiles} compiles in "
        f"{seconds:.1f} s in all. {_solver_words(p)}. overhead = "
        + (
            "predicted time of recomputation + host transfer not hidden"
            if p.objective == "time"
            else "recompute FLOPs + host transfer not hidden (--objective flops)"
        )
        + " (estimate); recompute = extra FLOPs"
    )
    # The plan's own point is found by its budget (data), then every key is worded once.
    points = list(points)
    mine = [pt.kind == "plan" and pt.budget_bytes == p.budget_bytes for pt in points]
    points = list(named_points(points))
    caption += _front_legend(points)
    timed = any(pt.step_seconds is not None for pt in points)
    mem = byte_unit(
        [pt.peak_bytes for pt in points] + [p.host_bytes, p.budget_bytes if not points else None]
    )
    step = second_unit(pt.step_seconds for pt in points)
    if timed:
        caption += f"; step {step.name}: predicted from the compiled kernels (remat_kit.timing)"
    copies = [pt.depth for pt in points if _extrapolated(pt.depth)]
    if copies:
        # The planner compiles whole what is near its budget; the rest (clear fits and
        # clear misses) stays read off the copies.
        caption += "\n~ " + depth_words(copies[0])
    if p.report is not None and p.report.step_time is not None:
        caption += "\nPLAN " + step_time_words(p.report.step_time, p.report.tokens_per_step)
    table = Table(title=title, caption=caption)
    columns = [
        "what",
        f"peak {mem.name}",
        "recompute",
        "overhead",
        f"host {mem.name}",
        "fits\nbudget",
        "front",
    ]
    if timed:
        columns.insert(4, f"step {step.name} (est.)")
    for col in columns:
        # The policy and where it stands are the answer: kept whole, broken between tokens.
        table.add_column(
            col,
            justify="left" if col in ("what", "front") else "right",
            no_wrap=col in ("what", "front"),
        )
    rows = sorted(
        zip(mine, points, strict=True), key=lambda r: (not r[0], r[1].kind, r[1].peak_bytes)
    )
    for is_mine, pt in rows:
        if is_mine:
            what = f"PLAN: {p.label}"
        elif pt.kind == "plan" and pt.policy is not None:
            what = f"{pt.label}: {label(pt.policy, pt.schedule)}"
        else:
            what = pt.label
        steps = [] if not timed else [step.cell(pt.step_seconds, 3 if step.name == "s" else 2)]
        table.add_row(
            cell(what, _NAME_WIDTH),
            ("~" if _extrapolated(pt.depth) else "") + mem.cell(pt.peak_bytes),
            pct(pt.recompute_overhead),
            pct(pt.overhead),
            *steps,
            mem.cell(p.host_bytes if is_mine else None),
            _YES_NO[pt.peak_bytes <= p.budget_bytes],
            cell(
                f"= {pt.same_as}"
                if pt.same_as is not None
                else "*"
                if not pt.dominated
                else f"dominated by {pt.dominated_by or ''}",
                _FRONT_WIDTH,
            ),
        )
    return table


def _front_legend(points: list[FrontPoint]) -> str:
    """The front column's marks explained, ``= X`` with a row's own X; a mark no row carries
    is not explained.

    Example:
      >>> from remat_kit.search import FrontPoint
      >>> pts = [FrontPoint("full", "catalogue", 1, 0.1, 0.1),  # undominated by default
      ...        FrontPoint("dots", "catalogue", 1, 0.1, 0.1, same_as="full")]
      >>> _front_legend(pts)
      '; * = on the Pareto front; = full: the same program as full'
    """
    legend = ""
    if any(pt.same_as is None and not pt.dominated for pt in points):
        legend += "; * = on the Pareto front"
    same = [pt.same_as for pt in points if pt.same_as is not None]
    if same:
        legend += f"; = {same[0]}: the same program as {same[0]}"
    return legend


def _extrapolated(depth: Mapping[str, Any] | None) -> bool:
    return (depth or {}).get("mode") == "extrapolated"


def _solver_words(p: Plan) -> str:
    """How sure the planner is, in words: the solver's status and gap."""
    st = p.solver
    if st is None:
        if p.source == "beside_none":  # none fits; a policy beside it is faster (issue 45)
            return "no program solved (none fits; a policy beside it is faster)"
        return "no program solved (no remat needed)"
    if st.optimal:
        proof = "optimal on its cost model"
    elif st.gap is not None:
        proof = f"{st.status}, within {100 * st.gap:.2f}% of optimal on its cost model"
    else:
        proof = st.status
    where = {"catalogue": "; a catalogue policy was at least as good", "schedule": ""}
    return f"solver ({st.solver}, {st.programs} programs, {st.seconds:.2f} s): {proof}" + where.get(
        p.source, ""
    )


def decision_table(p: Plan) -> Table:
    """The plan, per tag: saved, offloaded or recomputed (and per layer range when it varies).

    Args:
      p: the plan.

    Returns:
      The table.

    Example:
      >>> p = rk.plan(w, batch=2, budget=w.report("none", batch=2).peak_bytes - 1)
      >>> t = decision_table(p)
      >>> t.title, list(zip(t.columns[0].cells, t.columns[1].cells))[0]
      ('the plan, per tag: what names:save=mlpwo does', ('mlpwi_1', 'recompute'))
    """
    table = Table(title=f"the plan, per tag: what {short(p.policy.spec, 40)} does")
    table.add_column("tag")
    table.add_column("decision")
    if p.layers:
        table.add_column(f"layers 0-{p.layers - 1}")
    for tag, decision in p.decisions.items():
        cells = [tag, decision]
        if p.layers:
            cells.append(p.layer_decisions.get(tag, decision))
        table.add_row(*cells)
    return table
