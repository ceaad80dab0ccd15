"""The Pareto front: compiled peak against estimated overhead, the dominated points marked.

:func:`front` compiles catalogue policies and segment schedules and adds plans;
:func:`pareto_front` marks which points another beats on both axes. Drawing it is
:func:`remat_kit.render.plot_front`.

The overhead axis is the predicted step time recomputation and exposed transfers add
(``objective="time"``, the default) or the extra FLOPs (``"flops"``). In time, a policy whose
recomputation costs less than the memory traffic of the residuals it no longer saves is faster
than ``none`` and can dominate it; in FLOPs nothing can.

Example:
  >>> pts = rk.front(w, 2, policies=["none", "full", "minimal"], schedules=(), objective="flops")
  >>> [p.label for p in pts], pts[0].dominated  # no remat: the fewest FLOPs, never dominated
  (['none', 'full', 'minimal'], False)
  >>> timed = rk.front(w, 2, policies=["none", "minimal"], schedules=())
  >>> [(p.label, p.overhead < 0, p.dominated_by) for p in timed]  # minimal: faster than none
  [('none', False, 'minimal'), ('minimal', True, None)]
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from remat_kit._workers import ClusterError
from remat_kit.analysis import MemoryReport
from remat_kit.errors import BadValue
from remat_kit.notes import label
from remat_kit.policies import Policy, as_policy
from remat_kit.schedules import NO_SCHEDULE, Schedule, parse_schedule
from remat_kit.search._planner import Plan
from remat_kit.sources._workload import DEFAULT_HIDE, Workload

__all__ = [
    "FRONT_POLICIES",
    "FRONT_SCHEDULES",
    "FrontPoint",
    "compile_side_by_side",
    "front",
    "front_programs",
    "merged",
    "pareto_front",
    "plan_label",
]

#: Catalogue policies a Pareto front compiles by default (the main ones).
FRONT_POLICIES: tuple[str, ...] = (
    "none",
    "full",
    "block",
    "dots",
    "dots_no_batch",
    "minimal",
    "qkv_proj",
    "context",
    "megatron",
    "offload_dots_no_batch",
    "minimal_offloaded",
)

#: (policy, schedule) pairs a Pareto front compiles by default: segment checkpointing.
FRONT_SCHEDULES: tuple[tuple[str, str], ...] = (
    ("none", "sqrt"),
    ("none", "every:2"),
    ("full", "sqrt"),
    ("minimal", "every:2"),
)


@dataclasses.dataclass(frozen=True)
class FrontPoint:
    """One point of a memory / overhead front.

    Attributes:
      label: which point it is, a key the other points name in ``dominated_by`` and
        ``same_as``: the policy, ``policy @ schedule``, or for a plan ``plan:`` and the budget
        it was made for in bytes (:func:`plan_label`; its peak is ``peak_bytes``). Data, not
        words: :mod:`remat_kit.render` words a plan's key with its budget.
      kind: ``catalogue``, ``schedule`` or ``plan``.
      peak_bytes: compiled peak.
      overhead: estimated step-time overhead (recompute plus exposed host transfer).
      recompute_overhead: extra FLOPs of recomputation.
      fits: the peak fits the device (None when unknown).
      dominated: another point is at most as large and at most as slow, and better in one.
      dominated_by: the label of the first such point, in the order given.
      policy, schedule: the specs compiled (for a plan: the plan's).
      step_seconds: the step time predicted from the compiled kernels
        (:mod:`remat_kit.timing`; None where the target has no speed figures).
      program: the compiled program's fingerprint (None: not known).
      same_as: the label of the point that is the same program (set by :func:`pareto_front`:
        one front entry per program; None for that point and every other).
      depth: how an unrolled model's figures were made (the report's ``meta["depth"]``:
        ``mode`` ``extrapolated`` for a peak read off shallow copies), or None.
      budget_bytes: for a plan, the budget it was made for: which plan the point is; None
        for the rest.
      xla_remat_bytes: what XLA's own rematerialization pass took off the peak (0: it did
        not act), as the compiled report says (``MemoryReport.xla_remat_saved_bytes``).
    """

    label: str
    kind: str
    peak_bytes: int
    overhead: float
    recompute_overhead: float
    fits: bool | None = None
    dominated: bool = False
    dominated_by: str | None = None
    policy: str | None = None
    schedule: str | None = None
    step_seconds: float | None = None
    program: str | None = None
    same_as: str | None = None
    depth: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)
    budget_bytes: int | None = None
    xla_remat_bytes: int = 0


def pareto_front(
    points: Iterable[FrontPoint], *, rtol: float = 1e-6, peak_rtol: float = 1e-4
) -> tuple[FrontPoint, ...]:
    """Marks each point dominated or not (smaller peak and lower overhead both win).

    A point is dominated when another has a peak and an overhead no larger and is strictly
    better in at least one (overheads within ``rtol`` count as equal). Identical points do not
    dominate each other.

    Args:
      points: the points, any order.
      rtol: tolerance on overhead (float noise), relative to the larger of 1 and the value.
      peak_rtol: peaks this close (relative to the larger) count as equal: a
        schedule a few hundred bytes smaller does not stay on the front beside a plan of the
        same shown peak with less recompute.

    Points that are the same program (``program``: ``dots``, ``dots_no_batch`` and
    ``minimal`` lower alike on a Llama) are one entry: the first of them (a plan, if one is
    among them) keeps its place, the others take its verdict and name it in ``same_as``.

    Returns:
      The points in the same order, with ``dominated``/``dominated_by``/``same_as`` set.

    Example:
      >>> a = FrontPoint("a", "catalogue", 10, 0.2, 0.2)
      >>> b = FrontPoint("b", "catalogue", 12, 0.3, 0.3)
      >>> a.dominated, b.dominated  # on the front until pareto_front says otherwise
      (False, False)
      >>> [p.dominated for p in pareto_front([a, b])]
      [False, True]
      >>> c = FrontPoint("c", "catalogue", 10, 0.2, 0.2, program="f00d")
      >>> d = FrontPoint("d", "catalogue", 10, 0.2, 0.2, program="f00d")
      >>> [(p.label, p.same_as) for p in pareto_front([c, d])]
      [('c', None), ('d', 'c')]
    """
    pts = _one_per_program(list(points))
    out = []
    for p in pts:
        by = None
        for q in pts:
            if q is p or q.same_as is not None:
                continue  # a repeat of a program speaks through its first point
            tol = rtol * max(1.0, abs(p.overhead))
            slack = peak_rtol * max(p.peak_bytes, q.peak_bytes)
            le_peak = q.peak_bytes <= p.peak_bytes + slack
            le_over = q.overhead <= p.overhead + tol
            strict = q.peak_bytes < p.peak_bytes - slack or q.overhead < p.overhead - tol
            if le_peak and le_over and strict:
                by = q.label
                break
        out.append(dataclasses.replace(p, dominated=by is not None, dominated_by=by))
    return tuple(out)


def _one_per_program(pts: list[FrontPoint]) -> list[FrontPoint]:
    """``pts`` with every point that repeats an earlier one's program (a plan first) marked
    ``same_as`` it, and given its figures, so the two can never dominate each other."""
    first: dict[str, FrontPoint] = {}
    for p in sorted(pts, key=lambda q: q.kind != "plan"):  # stable: a plan, then input order
        if p.program is not None:
            first.setdefault(p.program, p)
    out = []
    for p in pts:
        q = first.get(p.program) if p.program is not None else None
        if q is None or q is p:
            out.append(dataclasses.replace(p, same_as=None))
        else:
            out.append(
                dataclasses.replace(
                    p, same_as=q.label, peak_bytes=q.peak_bytes, overhead=q.overhead
                )
            )
    return out


def merged(points: Iterable[FrontPoint]) -> tuple[FrontPoint, ...]:
    """One point per program: the points :func:`pareto_front` marked ``same_as`` another are
    left out and named in that one's label (``dots = dots_no_batch = minimal``), as a plot
    shows them.

    Example:
      >>> c = FrontPoint("c", "catalogue", 10, 0.2, 0.2, program="f00d")
      >>> d = FrontPoint("d", "catalogue", 10, 0.2, 0.2, program="f00d")
      >>> [p.label for p in merged(pareto_front([c, d]))]
      ['c = d']
    """
    pts = list(points)
    alias: dict[str, list[str]] = {}
    for p in pts:
        if p.same_as is not None:
            alias.setdefault(p.same_as, []).append(p.label)
    return tuple(
        dataclasses.replace(p, label=" = ".join([p.label, *alias.get(p.label, [])]))
        for p in pts
        if p.same_as is None
    )


def front(
    workload: Workload,
    batch: int,
    *,
    policies: Iterable[Any] = FRONT_POLICIES,
    schedules: Iterable[tuple[Any, Any]] = FRONT_SCHEDULES,
    plans: Iterable[Plan] = (),
    hide: float = DEFAULT_HIDE,
    objective: str = "time",
) -> tuple[FrontPoint, ...]:
    """Compiles catalogue policies and segment schedules; returns them and ``plans`` as a front.

    The catalogue and schedule points do not depend on each other: they are compiled first,
    together (:func:`compile_side_by_side`: side by side where the workload has a
    :attr:`~remat_kit.sources.Workload.spread` with workers and its compiles are slow), then
    read in order.

    Args:
      workload: the step.
      batch: the batch.
      policies: catalogue policies (names/specs/Policies), each with schedule ``none``.
      schedules: ``(policy, schedule)`` pairs.
      plans: Plans for the same workload and batch.
      hide: as for :func:`plan` (offload beyond it counts as overhead).
      objective: as for :func:`plan` (``time`` or ``flops``: what the overhead axis is).

    Returns:
      FrontPoints with dominated ones marked (see :func:`pareto_front`).

    Raises:
      ValueError: a plan for another batch.

    Example:
      >>> p = rk.plan(w, batch=2, budget=w.report("none", batch=2).peak_bytes - 1)
      >>> pts = rk.front(w, 2, policies=["none", "full"], schedules=(), plans=[p])
      >>> [q.label for q in pts], pts[-1].dominated_by
      (['none', 'full', 'plan:...'], None)
    """
    wanted = front_programs(workload, policies, schedules)
    compile_side_by_side(workload, [(pol, s, batch) for pol, s, _, _ in wanted])
    pts = [
        _point(workload, batch, pol, s, name, kind, hide, objective)
        for pol, s, name, kind in wanted
    ]
    for p in plans:
        if p.batch != batch:
            raise BadValue(f"a plan for batch {p.batch} cannot join a front for batch {batch}")
        pts.append(
            FrontPoint(
                label=plan_label(p),
                kind="plan",
                peak_bytes=p.peak_bytes,
                overhead=p.overhead,
                recompute_overhead=p.recompute_overhead,
                fits=p.report.fits if p.report is not None else None,
                policy=p.policy.spec,
                schedule=p.schedule.spec,
                step_seconds=(
                    p.report.step_time.seconds
                    if p.report is not None and p.report.step_time is not None
                    else None
                ),
                program=p.report.meta.program if p.report is not None else None,
                depth=p.report.meta.depth if p.report is not None else None,
                budget_bytes=p.budget_bytes,
                xla_remat_bytes=_xla_cut(p.report),
            )
        )
    return pareto_front(pts)


def front_programs(
    workload: Workload, policies: Iterable[Any], schedules: Iterable[tuple[Any, Any]]
) -> list[tuple[Policy, Schedule, str, str]]:
    """The programs a front compiles, in its order: ``(policy, schedule, label, kind)`` of
    each catalogue policy, then of each ``(policy, schedule)`` pair the workload can build
    (a factory's model may take no schedules).

    Example (this ``w``'s model takes no layer schedules, so the pair is left out):
      >>> [(name, kind) for _, _, name, kind in front_programs(w, ["full"], [("full", "sqrt")])]
      [('full', 'catalogue')]
    """
    wanted = [(pol, NO_SCHEDULE, pol.spec, "catalogue") for pol in map(as_policy, policies)]
    for spec, sch in schedules:
        pol, s = as_policy(spec), parse_schedule(sch)
        if workload.supports(s):
            wanted.append((pol, s, label(pol.spec, s.spec), "schedule"))
    return wanted


def compile_side_by_side(workload: Workload, keys: Sequence[tuple[Policy, Schedule, int]]) -> None:
    """Compiles programs that do not depend on each other through
    :meth:`~remat_kit.sources.Workload.compile_all`: side by side where the workload has a
    :attr:`~remat_kit.sources.Workload.spread` with workers and the first program took at
    least the spread's ``slow_seconds`` to compile here (a worker takes seconds to start:
    quicker programs compile here, one by one, as the points are read): the second here,
    the others in the workers at the same time. Without workers, all here, in the order of
    ``keys``. Their reports join the workload's caches.

    A worker or a cluster lost on the way raises nothing here: what it did not bring back
    compiles here, one by one, as the points are read.

    Args:
      workload: the step.
      keys: the typed (policy, schedule, batch) of each program.
    """
    spread = workload.spread
    try:
        if spread is None or not spread.side_by_side:
            workload.compile_all(keys)
            return
        t0 = time.perf_counter()
        workload.compile_all(keys[:1])
        if time.perf_counter() - t0 >= spread.slow_seconds:
            # The next one here while the rest compile in workers: none waits on another.
            workload.compile_all(keys[1:], at_once=True)
    except (ClusterError, BrokenProcessPool):
        return


def plan_label(p: Plan) -> str:
    """The key of a plan's point on a front: the budget it was made for, in bytes, never its
    peak (two plans for budgets that round alike stay two points; words are render's).

    Example:
      >>> plan_label(rk.plan(w, batch=2, budget=2**30))
      'plan:1073741824'
    """
    return f"plan:{p.budget_bytes}"


def _point(
    w: Workload,
    batch: int,
    pol: Policy,
    sch: Schedule,
    label: str,
    kind: str,
    hide: float,
    objective: str,
) -> FrontPoint:
    r = w.compiled(pol, sch, batch)
    return FrontPoint(
        label=label,
        kind=kind,
        peak_bytes=r.peak_bytes,
        overhead=w.overhead_of(r, batch, hide, objective),
        recompute_overhead=w.recompute_of(pol, sch, batch),
        fits=r.fits,
        policy=pol.spec,
        schedule=sch.spec,
        step_seconds=r.step_time.seconds if r.step_time is not None else None,
        program=r.meta.program,
        depth=r.meta.depth,
        xla_remat_bytes=_xla_cut(r),
    )


def _xla_cut(report: MemoryReport | None) -> int:
    """What XLA's own remat pass took off a report's peak, where it acted (else 0)."""
    return report.xla_remat_saved_bytes if report is not None and report.xla_remat else 0
