"""Search over compiled reports: largest batch, cheapest plan under a budget, Pareto front, advice.

Everything here loops over :mod:`remat_kit.analysis`; nothing here knows about model presets,
and nothing here draws (plots are :mod:`remat_kit.render`). A :class:`remat_kit.sources.Workload`
(``rk.sources.workload(source, target, config)``) is the one thing the search needs: the
cached view of a model source's train step on a target, compiled (or traced) for any policy,
layer schedule and batch size, so a plan, a max-batch search and a Pareto front over the same
workload share their compiles.

The questions, one module each:

- :func:`max_batch` (``batch``) and :func:`max_seq` (``seq``): the largest batch, or the
  longest sequence at a fixed batch, whose compiled peak fits the device minus a headroom.
  One boundary search (``boundary``) over either axis, with one answer, a :class:`Fit`: each
  axis opens with its own first probes, then a curve through the compiled peaks (a line along
  the batch; along the sequence a line under flash attention, a quadratic where einsum
  attention holds its scores) predicts the boundary and two compiles verify it. The sequence
  search takes a builder ``seq -> Workload`` (the sequence changes the traced program).
- :func:`plan` (``planner``): the plan with the lowest estimated step-time overhead whose
  *compiled* peak fits a budget: solved exactly on a traced cost model (a mixed-integer program,
  ``scipy.optimize.milp``), then verified by compiling (the algorithm is in its docstring).
- :func:`front` / :func:`pareto_front` (``front``): memory against overhead over catalogue
  policies, layer schedules and plans, with the dominated points marked.
- :func:`fastest` (``throughput``): which policy and micro-batch (and, for a global batch,
  accumulation) train fastest: predicted tokens/s at the batches that fit.
- :func:`advise` (``advise``): for every GPU target, does the step fit, with which plan, at what
  overhead, and how large a batch the target takes.

:func:`plan_front` (``recommend``) joins the second and third: the plan, compiled beside the
catalogue as a front, optionally with the planner's own curve swept (``remat-kit plan``).

Budgets (``budget``) are read by :func:`parse_budget`; :func:`check_budget` raises
:class:`remat_kit.errors.DoesNotFit` when no policy can reach one.

Example (``tiny_model`` is a factory ``tiny_model(policy)`` of a small Flax model; see
:mod:`remat_kit.sources`):
  >>> import remat_kit as rk
  >>> w = rk.sources.workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16, optimizer="sgd"))
  >>> no_remat = w.report("none", batch=2).peak_bytes
  >>> p = rk.plan(w, batch=2, budget=no_remat - 1)
  >>> p.fits, p.peak_bytes < no_remat, p.policy.spec, p.schedule.spec
  (True, True, 'names:save=mlpwo', 'none')
"""

from remat_kit.search._advise import Advice, ScaleOut, advise, gpus_needed
from remat_kit.search._batch import DEFAULT_BATCH_CAP, max_batch, max_batch_plan
from remat_kit.search._boundary import Fit
from remat_kit.search._budget import DEFAULT_HEADROOM, check_budget, limit_for, parse_budget
from remat_kit.search._cost import RANKINGS, Cost, cost_of, rank_costs
from remat_kit.search._fit import AXES, PLAN, fit, fit_each
from remat_kit.search._front import (
    FRONT_POLICIES,
    FRONT_SCHEDULES,
    FrontPoint,
    front,
    merged,
    pareto_front,
    plan_label,
)
from remat_kit.search._next import CHANGE_KINDS, Change, NextStep, next_step
from remat_kit.search._planner import Plan, PlanCandidate, SolverStatus, plan
from remat_kit.search._recommend import PlanFront, compile_bound, plan_front
from remat_kit.search._seq import (
    DEFAULT_GRANULARITY,
    DEFAULT_SEQ_CAP,
    max_seq,
    max_seq_plan,
    seq_multiple,
)
from remat_kit.search._throughput import Fastest, Throughput, fastest
from remat_kit.sources._workload import DEFAULT_HIDE, OBJECTIVES

__all__ = [
    "AXES",
    "CHANGE_KINDS",
    "DEFAULT_BATCH_CAP",
    "DEFAULT_GRANULARITY",
    "DEFAULT_HEADROOM",
    "DEFAULT_HIDE",
    "DEFAULT_SEQ_CAP",
    "FRONT_POLICIES",
    "FRONT_SCHEDULES",
    "OBJECTIVES",
    "PLAN",
    "RANKINGS",
    "Advice",
    "Change",
    "Cost",
    "Fastest",
    "Fit",
    "FrontPoint",
    "NextStep",
    "Plan",
    "PlanCandidate",
    "PlanFront",
    "ScaleOut",
    "SolverStatus",
    "Throughput",
    "advise",
    "check_budget",
    "compile_bound",
    "cost_of",
    "fastest",
    "fit",
    "fit_each",
    "front",
    "gpus_needed",
    "limit_for",
    "max_batch",
    "max_batch_plan",
    "max_seq",
    "max_seq_plan",
    "merged",
    "next_step",
    "pareto_front",
    "parse_budget",
    "plan",
    "plan_front",
    "plan_label",
    "rank_costs",
    "seq_multiple",
]
