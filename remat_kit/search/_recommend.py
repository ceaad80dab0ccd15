"""The plan with its front: plan, compile what it is shown beside, sweep, re-plan.

:func:`plan_front` is what ``remat-kit plan`` does, for library users: the cheapest plan under a
budget (:func:`~remat_kit.search.plan`), the catalogue policies compiled beside it as a Pareto
front (:func:`~remat_kit.search._front`), and, with ``sweep``, the planner's own curve (plans at
the peaks of the catalogue points that fit) and segment schedules, after which a swept plan that
beats the first on both axes becomes the recommendation.

Example:
  >>> pf = plan_front(w, 2, w.report("none", batch=2).peak_bytes - 1, catalogue=["none", "full"])
  >>> pf.plan.fits, [q.label for q in pf.points]
  (True, ['none', 'full', 'plan:...'])
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from remat_kit.notes import Note, words
from remat_kit.search._budget import DEFAULT_HEADROOM, check_budget, limit_for
from remat_kit.search._front import (
    FRONT_POLICIES,
    FRONT_SCHEDULES,
    FrontPoint,
    compile_side_by_side,
    front,
    front_programs,
    pareto_front,
)
from remat_kit.search._planner import (
    FALLBACK_SCHEDULES,
    MAX_PLAN_COMPILES,
    Plan,
    check_plan_args,
    plan,
)
from remat_kit.search._xla_fit import xla_made_fit
from remat_kit.sources._workload import DEFAULT_HIDE, Workload

__all__ = [
    "SWEEP_PLANS",
    "PlanFront",
    "compile_bound",
    "plan_front",
]

#: How many extra budgets a sweep plans for (the smallest catalogue peaks that fit).
SWEEP_PLANS = 4


@dataclasses.dataclass(frozen=True)
class PlanFront:
    """The recommended plan and the front it was checked against.

    Attributes:
      plan: the recommendation (after a sweep, possibly a re-plan that a swept plan improved).
      points: the catalogue points, the plan's own point and, with a sweep, the swept plans and
        segment schedules, with the Pareto front marked (``FrontPoint.dominated``).
      plan_seconds: wall time of the first plan.
      seconds: wall time of everything.
      swept: the plans made for other budgets by the sweep (empty without one).
    """

    plan: Plan
    points: tuple[FrontPoint, ...]
    plan_seconds: float
    seconds: float
    swept: tuple[Plan, ...] = ()

    @property
    def caveats(self) -> tuple[Note, ...]:
        """What a user should read beside the plan and its front: a ``xla_remat_made_fit``
        note for each program shown (the plan's included, once) that fits the plan's budget
        only because XLA's own remat pass took bytes off its peak
        (:func:`~remat_kit.search._xla_fit.xla_made_fit`)."""
        notes, seen = [], set()
        for pt in self.points:
            what = (pt.policy, pt.schedule)
            if pt.same_as is not None or pt.policy is None or what in seen:
                continue  # a repeat of a program speaks through its first point
            note = xla_made_fit(
                pt.policy,
                pt.schedule or "none",
                "batch",
                self.plan.batch,
                peak_bytes=pt.peak_bytes,
                saved_bytes=pt.xla_remat_bytes,
                limit_bytes=self.plan.budget_bytes,
            )
            if note is not None:
                seen.add(what)
                notes.append(note)
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``plan`` (``Plan.to_dict()``), ``front`` (the points), the times and
        ``caveats`` (each ``Note.to_dict()`` with its words as ``text``)."""
        return {
            "plan": self.plan.to_dict(),
            "front": [dataclasses.asdict(pt) for pt in self.points],
            "plan_seconds": self.plan_seconds,
            "seconds": self.seconds,
            "caveats": [{**n.to_dict(), "text": words(n)} for n in self.caveats],
        }


def compile_bound(
    workload: Workload, catalogue: Iterable[Any], *, sweep: bool = False
) -> int | None:
    """At most how many programs :func:`plan_front` compiles for ``workload``, said before it
    starts; None where the count is adaptive (``sweep``: plans at budgets the front finds).

    ``none`` once, the solver's plans (``MAX_PLAN_COMPILES``), ``full`` and its segment
    schedules (``FALLBACK_SCHEDULES``) and the catalogue (compiled beside the plan and shown on
    the front: the same programs); twice as many where a peak read off shallow copies of an
    unrolled model may be compiled whole to confirm it (``Workload.estimates``).

    Example:
      >>> compile_bound(w, ["full", "minimal"]), w.estimates  # 1 + 6 + 5 + 2, x 2
      (28, True)
    """
    if sweep:
        return None
    programs = 1 + MAX_PLAN_COMPILES + len(FALLBACK_SCHEDULES) + len(list(catalogue))
    return programs * (2 if workload.estimates else 1)


def plan_front(
    workload: Workload,
    batch: int,
    budget: int | None = None,
    *,
    catalogue: Iterable[Any] = FRONT_POLICIES,
    host_budget: int | None = None,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    headroom: float = DEFAULT_HEADROOM,
    sweep: bool = False,
    schedules: Iterable[tuple[Any, Any]] = FRONT_SCHEDULES,
    objective: str = "time",
    progress: Callable[[str], None] | None = None,
) -> PlanFront:
    """The cheapest plan under ``budget``, compiled beside the catalogue as a Pareto front.

    1. :func:`~remat_kit.search.plan` with the catalogue (and, with ``sweep``, the segment
       schedules) as ``extra``: the plan is never dominated by what it is shown beside.
    2. The catalogue policies are compiled and joined with the plan into a front.
    3. With ``sweep``: plans for the peaks of the catalogue points that fit (the
       :data:`SWEEP_PLANS` smallest) and the segment ``schedules`` join the front. A swept
       plan may, through compile noise, beat the first on both axes: the plan is then made
       again with the swept plans as ``extra`` (compiled already, so no compile) and replaces
       the first on the front.

    Where the workload has a :attr:`~remat_kit.sources.Workload.spread` with workers, the
    catalogue (and the swept schedules) are compiled before 1., side by side where they are
    slow to compile (:func:`~remat_kit.search._front.compile_side_by_side`): none depends on
    what the plan finds. The plans stay one after another (each starts from the last's
    corrections).

    Args:
      workload: the step (needs residuals: ``Workload.plannable``).
      batch: the batch to plan for.
      budget: bytes; default device memory minus ``headroom``.
      catalogue: policies compiled beside the plan (names, specs or Policies).
      host_budget: bytes of pinned host memory the plan may offload to (None: no limit; 0:
        no offload).
      offload: allow offloading to host memory.
      hide: fraction of the step's compute time transfers may take and count as hidden.
      headroom: used only when ``budget`` is None.
      sweep: also plan for other budgets and compile the segment schedules (the whole curve,
        as ``remat-kit plan --plot`` draws it).
      schedules: ``(policy, schedule)`` pairs compiled with ``sweep``.
      objective: ``time`` (predicted step time) or ``flops``: what the plan minimises and
        the front's overhead axis (see :func:`~remat_kit.search.plan`).
      progress: called with a few words as each stage starts (for a progress bar).

    Returns:
      A PlanFront. ``plan.fits`` is False when nothing reaches the budget.

    Raises:
      DoesNotFit: a budget below what no policy removes.
      ValueError: as :func:`~remat_kit.search.plan` (a budget above the device, a bad batch,
        host budget or ``hide``).
    """
    start = time.perf_counter()
    say = progress or (lambda words: None)
    catalogue = list(catalogue)
    schedules = list(schedules) if sweep else []
    # What the front shows beside the plan is what the plan must not be dominated by.
    beside: list[Any] = [*catalogue, *schedules]
    cost = {"hide": hide, "objective": objective}
    options = {"host_budget": host_budget, "offload": offload, **cost}
    spread, before = workload.spread, workload.compiles
    ahead = spread is not None and spread.side_by_side
    if ahead:
        # The plan compiles what it is shown beside one by one (its extras), and the front
        # compiles what is left of them: programs that depend on nothing the plan finds, so
        # they go side by side first, once the plan's arguments are known good. Without
        # workers they are left to the plan.
        _check_plan_args(workload, batch, budget, headroom, host_budget, hide, objective)
        keys = [(pol, s, batch) for pol, s, _, _ in front_programs(workload, catalogue, schedules)]
        say(f"compiling the {len(keys)} programs beside the plan (side by side where slow)")
        compile_side_by_side(workload, keys)
    say("planning (cost model, solver, verifying compiles)")
    p = plan(workload, batch, budget, headroom=headroom, extra=beside, **options)
    plan_seconds = time.perf_counter() - start
    if ahead:
        # They were the plan's to compile: its count and time hold them, as without workers.
        p = dataclasses.replace(p, compiles=workload.compiles - before, seconds=plan_seconds)
    say(f"compiling the {len(catalogue)} catalogue policies beside the plan")
    points = front(workload, batch, policies=catalogue, schedules=(), plans=[p], **cost)
    swept: list[Plan] = []
    if sweep:
        say("sweeping the planner's curve and the layer schedules")
        swept = _sweep(workload, batch, p, points, options)
        more = front(workload, batch, policies=(), schedules=schedules, plans=swept, **cost)
        points = pareto_front([*points, *more])
        better = [
            (pt.policy, pt.schedule)
            for pt in points
            if pt.kind == "plan" and pt.policy is not None and pt.budget_bytes != p.budget_bytes
        ]
        if better:
            p = plan(
                workload,
                batch,
                budget,
                headroom=headroom,
                extra=[*beside, *better],
                **options,
            )
            points = [pt for pt in points if pt.kind != "plan" or pt.budget_bytes != p.budget_bytes]
            mine = front(workload, batch, policies=(), schedules=(), plans=[p], **cost)
            points = pareto_front([*points, *mine])
    return PlanFront(
        plan=p,
        points=tuple(points),
        plan_seconds=plan_seconds,
        seconds=time.perf_counter() - start,
        swept=tuple(swept),
    )


def _check_plan_args(
    workload: Workload,
    batch: int,
    budget: int | None,
    headroom: float,
    host_budget: int | None,
    hide: float,
    objective: str,
) -> None:
    """What :func:`~remat_kit.search.plan` refuses before it compiles, refused before the
    programs beside it are compiled ahead of it."""
    check_plan_args(workload, batch, hide=hide, host_budget=host_budget, objective=objective)
    check_budget(workload, batch, limit_for(workload.target, budget, headroom))


def _sweep(
    w: Workload, batch: int, p: Plan, points: Sequence[FrontPoint], options: dict[str, Any]
) -> list[Plan]:
    """Plans at the peaks of the catalogue points that fit: the planner's own curve."""
    budgets = sorted(
        {pt.peak_bytes for pt in points if pt.kind == "catalogue" and pt.fits} - {p.budget_bytes}
    )
    plans = []
    for b in budgets[:SWEEP_PLANS]:
        got = plan(w, batch, b, **options)
        if got.fits:
            plans.append(got)
    return plans
