"""What the planner returns: the :class:`Plan` and every program it compiled on the way
(:class:`PlanCandidate`). The planner itself is :mod:`remat_kit.search._planner`.

Example:
  >>> p = rk.plan(w, batch=2, budget=w.report("none", batch=2).peak_bytes - 1)
  >>> isinstance(p, Plan), p.candidates[0].label
  (True, 'none')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from remat_kit.analysis import MemoryReport
from remat_kit.notes import Note, label, words
from remat_kit.policies import Policy
from remat_kit.schedules import Schedule
from remat_kit.search._solver import SolverStatus

__all__ = [
    "Plan",
    "PlanCandidate",
]


@dataclasses.dataclass(frozen=True)
class PlanCandidate:
    """One program the planner compiled.

    Attributes:
      label: how the planner got it (``none``, ``solver 1``, ``smallest``, ``catalogue``,
        ``schedule``).
      policy, schedule: specs.
      peak_bytes: compiled peak.
      estimated_peak_bytes: the planner's estimate before compiling (None when it had none).
      recompute_overhead: extra FLOPs of recomputation (traced).
      overhead: estimated step-time overhead (recompute plus host transfer not hidden), in
        the unit of ``objective``.
      host_bytes: bytes offloaded to host memory.
      fits: compiled peak <= budget (and host bytes <= the host budget, when there is one).
    """

    label: str
    policy: str
    schedule: str
    peak_bytes: int
    estimated_peak_bytes: int | None
    recompute_overhead: float
    overhead: float
    host_bytes: int
    fits: bool


@dataclasses.dataclass(frozen=True)
class Plan:
    """The cheapest plan the planner found for a budget.

    Pass ``policy`` and ``schedule`` to the model (``models.get_config(name,
    policy=p.policy, schedule=p.schedule)``), or ``policy`` to ``rk.remat`` when the schedule
    is ``none``.

    Attributes:
      policy: the per-layer policy (for the layers the schedule does not name).
      schedule: the layer schedule: ``none``; ``layers`` when the first ``layers`` layers
        decide differently from the rest; or a segment schedule.
      decisions: tag -> ``"save" | "recompute" | "offload"`` under ``policy`` (what the
        recommended policy does: by its names, or traced for pattern policies such as ``dots``).
      layer_decisions: tag -> decision in the first ``layers`` layers, where it differs.
      layers: how many layers follow ``layer_decisions`` (0: none).
      batch: the batch planned for.
      budget_bytes: the budget.
      peak_bytes: compiled peak of the plan (the smallest reached when nothing fits).
      fits: ``peak_bytes <= budget_bytes`` (and host bytes within ``host_budget_bytes``).
      recompute_overhead: extra FLOPs of recomputation against no remat.
      overhead: estimated step-time overhead (recompute plus host transfer not hidden), in
        the unit of ``objective``.
      host_bytes: bytes offloaded to host per step.
      transfer_seconds: their estimated round trip over the host link.
      candidates: every program compiled, in order.
      compiles: programs compiled for this plan (cached ones not counted).
      seconds: wall time.
      note: what the plan is, or why nothing fits, as data (kind ``plan_fits`` or
        ``plan_nothing_fits``); ``message`` is its words.
      host_budget_bytes: the host-memory budget (None: none).
      solver: the proof: the last program solved (status, bound, gap) measured against the
        plan's assignment; ``optimal`` when it shows that no assignment cheaper on the cost
        model meets the caps as the compiles corrected them. None when no program was solved
        (``none`` fits).
      source: where the plan comes from: ``none`` (no remat needed), ``beside_none`` (none
        fits, but a policy given in ``extra`` is as fast and smaller, or faster: no program
        solved), ``solver``, ``catalogue`` (a policy given in ``extra`` that is at least as
        good as the solver's plan), ``schedule`` (segment checkpointing), or ``nothing``
        (nothing fits; the smallest peak reached).
      objective: what ``overhead`` measures: ``time`` (predicted step time) or ``flops``.
      report: the compiled report of the plan.
    """

    policy: Policy
    schedule: Schedule
    decisions: Mapping[str, str]
    layer_decisions: Mapping[str, str]
    layers: int
    batch: int
    budget_bytes: int
    peak_bytes: int
    fits: bool
    recompute_overhead: float
    overhead: float
    host_bytes: int
    transfer_seconds: float | None
    candidates: tuple[PlanCandidate, ...]
    compiles: int
    seconds: float
    note: Note
    host_budget_bytes: int | None = None
    solver: SolverStatus | None = None
    source: str = "solver"
    objective: str = "time"
    report: MemoryReport | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``policy`` or ``policy @ schedule``."""
        return label(self.policy.spec, self.schedule.spec)

    @property
    def message(self) -> str:
        """The note in words: one line for the user."""
        return words(self.note)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (policy and schedule as specs, the note as ``Note.to_dict()``), plus
        ``message``, the note in words."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("policy", "schedule", "candidates", "report", "solver", "note")
        }
        out.update(
            policy=self.policy.spec,
            schedule=self.schedule.spec,
            decisions=dict(self.decisions),
            layer_decisions=dict(self.layer_decisions),
            candidates=[dataclasses.asdict(c) for c in self.candidates],
            note=self.note.to_dict(),
            message=self.message,
            step_time=(
                self.report.step_time.to_dict()
                if self.report is not None and self.report.step_time is not None
                else None
            ),
            solver=dataclasses.asdict(self.solver) if self.solver is not None else None,
        )
        return out
