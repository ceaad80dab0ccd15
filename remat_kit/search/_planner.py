"""The planner: the cheapest plan whose compiled peak fits a memory budget.

:func:`plan` solves the keep/recompute/offload choice per tag (and per layer range) exactly on
its traced cost model (:mod:`remat_kit.search._costs`; the solver, a mixed-integer program for
``scipy.optimize.milp``, is :mod:`remat_kit.search._solver`), then compiles the answer and
corrects the model by what the compiler says; the algorithm is in its docstring.

Example:
  >>> p = rk.plan(w, batch=2, budget=w.report("none", batch=2).peak_bytes - 1)
  >>> p.fits, p.policy.spec, p.source, p.solver.optimal
  (True, 'names:save=mlpwo', 'solver', True)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from remat_kit.errors import BadType, BadValue
from remat_kit.notes import Note
from remat_kit.policies import FULL, NO_REMAT, Policy, as_policy, decide
from remat_kit.schedules import NO_SCHEDULE, Schedule, parse_schedule
from remat_kit.search._budget import DEFAULT_HEADROOM, check_budget, limit_for
from remat_kit.search._costs import CostModel, cost_model
from remat_kit.search._plans import Plan, PlanCandidate
from remat_kit.search._solver import Solution, SolverStatus, solve
from remat_kit.sources._workload import DEFAULT_HIDE, FIXED_PARTS, OBJECTIVES, Workload, host_bytes

__all__ = [
    "Plan",
    "PlanCandidate",
    "SolverStatus",
    "check_plan_args",
    "plan",
]

#: Compiles the solver's plans may take (step 4 of :func:`plan`) by default.
MAX_PLAN_COMPILES = 6

#: The schedules of ``full`` tried when no plan of the solver fits, before their FLOPs order.
FALLBACK_SCHEDULES = ("none", "sqrt", "every:2", "nested:2", "nested:3")

#: Overheads this close (relative to max(1, overhead)) count as equal, as on the Pareto front.
_RTOL = 1e-6


def plan(
    workload: Workload,
    batch: int,
    budget: int | None = None,
    *,
    headroom: float = DEFAULT_HEADROOM,
    host_budget: int | None = None,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
    max_compiles: int = MAX_PLAN_COMPILES,
    objective: str = "time",
    lora: Workload | None = None,
) -> Plan:
    """The plan with the lowest estimated overhead whose compiled peak fits ``budget``.

    The algorithm:

    1. ``none`` (no remat) is compiled first: if it fits, it is the plan, at zero overhead.
       When its inputs and residuals alone (traced) are over the budget it cannot fit and is
       not compiled.
    2. The cost model is traced (no compile): every tag's residual bytes and recompute FLOPs
       from "save every tagged tensor" and one trace per tag, with the tags that only another's
       recompute makes needed (``out_proj`` under ``attn_out``) traced as pairs; see
       :mod:`remat_kit.search._costs`.
    3. The keep/recompute/offload decision of every tag, in all layers or separately in the
       first ``k`` (a ``layers`` schedule; every ``k`` up to half the depth), is solved exactly
       on that model as a mixed-integer program (``scipy.optimize.milp``, HiGHS): least
       overhead (recompute FLOPs plus the host round trip beyond ``hide`` x the step's
       compute) such that the residual bytes fit the budget minus an offset, and the
       offloaded bytes fit ``host_budget``. The offset (what the compiled peak holds besides
       the residuals: weights, gradients, optimizer state, workspace) starts as that of
       ``none``.
    4. Verification by compiling: the solution is compiled; the offset is corrected to what
       that compile shows (separately for plans with a layer split, whose two scans can cost
       memory of their own) and the program is solved again. A compile over budget tightens
       the cap, one under it may free a cheaper assignment; the search stops when the
       solution under the corrected model is no cheaper than the best compiled plan that fits,
       after ``max_compiles`` compiles, or when the model says nothing fits (then ``full``, and
       if even it does not fit, its segment schedules ``sqrt``, ``every:2``, ``nested:2/3``, in
       order of FLOPs). A plan is only returned on a compiled peak.
    5. Policies in ``extra`` (e.g. the catalogue; a policy or a ``(policy, schedule)`` pair)
       whose traced recompute is not above the plan's overhead are compiled; one that fits is
       recommended when it is cheaper, or as cheap and smaller, so the plan is never dominated
       by what it is shown beside.

    Args:
      workload: the step (needs residuals: ``Workload.plannable``).
      batch: the batch to plan for.
      budget: bytes (see :func:`parse_budget`); default device memory minus ``headroom``.
      headroom: used only when ``budget`` is None (default 0: the whole device).
      host_budget: bytes of pinned host memory the plan may offload to (None: no limit; 0:
        no offload).
      offload: allow offloading to host memory (default True).
      hide: fraction of the step's compute time transfers may take and count as hidden
        (default 0.5).
      extra: policies (names, specs, Policies, or ``(policy, schedule)`` pairs) to compare
        against, e.g. the catalogue.
      max_compiles: compiles allowed for step 4.
      objective: what "overhead" is (:data:`~remat_kit.sources._workload.OBJECTIVES`):
        ``time``, the predicted step time each tag's recomputation adds at the target's rates
        (compiled plans: from their kernels, :mod:`remat_kit.timing`); ``flops``, extra
        FLOPs as if at peak. Host transfers beyond ``hide`` count in both.
      lora: the same step with LoRA adapters trained alone, which sizes the LoRA hint of a
        budget below what no policy removes (see :func:`check_budget`); None: no LoRA hint.

    Returns:
      The Plan. ``fits`` is False when nothing reaches the budget; its ``note`` then holds the
      smallest peak reached and with what. ``solver`` holds the program's status and gap.

    Raises:
      DoesNotFit: a budget below weights + gradients + optimizer state (a ValueError; it
        carries the breakdown and what would fit, see :func:`check_budget`).
      ValueError: budget above the device memory; a negative host budget; a batch that is not
        a positive multiple of the accumulation steps.
      TypeError: a host budget that is not an int of bytes.

    Example:
      >>> budget = w.report("none", batch=2).peak_bytes - 1  # just under no remat
      >>> p = rk.plan(w, batch=2, budget=budget, host_budget=0)
      >>> p.fits, p.host_bytes, p.decisions
      (True, 0, {'mlpwi_1': 'recompute', 'mlpwo': 'save'})
      >>> model = tiny_model(p.policy)  # the model, built with the plan's policy
    """
    t0 = time.perf_counter()
    before = workload.compiles
    check_plan_args(workload, batch, hide=hide, host_budget=host_budget, objective=objective)
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 1:
        raise BadValue(f"max_compiles={max_compiles!r} must be a positive int")
    budget = limit_for(workload.target, budget, headroom)
    check_budget(workload, batch, budget, lora=lora)
    extras = [_as_extra(p) for p in extra]
    ctx = _PlanContext(workload, batch, budget, hide, host_budget, objective)

    # A model whose trainer always checkpoints (MaxText) has no setting for `none`.
    bounded = not workload.remat_always and _none_lower_bound(workload, batch) > budget
    if not workload.remat_always and not bounded:
        none = ctx.compile(NO_REMAT, NO_SCHEDULE, "none")
        if none.fits:
            # No remat is needed, but a policy beside it may still be faster and smaller
            # (in time, recomputing can cost less than reading a residual back): the plan
            # is never one its own front shows dominated.
            chosen = _best_of(ctx, none, extras)
            source = "none" if chosen is none else "beside_none"
            return ctx.result(chosen, before, t0, source=source)

    use_offload = offload and host_budget != 0
    model = cost_model(workload, batch, offload=use_offload, hide=hide, objective=objective)
    best, sol, status = _solve_and_verify(ctx, model, max_compiles)
    source = "solver"
    if best is None:
        best, source = _segment_fallback(ctx), "schedule"

    if best is None and bounded:
        # The traced bound may overstate `none` (a residual XLA never materialises: the
        # transposed embedding of a tied head, fused into its matmul): before nothing is
        # said to fit, the compiled `none` judges.
        none = ctx.compile(NO_REMAT, NO_SCHEDULE, "none")
        if none.fits:
            chosen = _best_of(ctx, none, extras)
            source = "none" if chosen is none else "beside_none"
            return ctx.result(chosen, before, t0, solver=status, source=source)
    if best is None:
        smallest = min(ctx.candidates, key=lambda c: c.peak_bytes)
        return ctx.result(smallest, before, t0, fits=False, solver=status, source="nothing")
    chosen = _best_of(ctx, best, extras)
    if chosen is not best:
        return ctx.result(chosen, before, t0, solver=status, source="catalogue")
    if source == "schedule":
        return ctx.result(best, before, t0, solver=status, source=source)
    assert sol is not None and status is not None
    return ctx.result(best, before, t0, solver=status, source=source, chose=_chose(sol, status))


def _none_lower_bound(workload: Workload, batch: int) -> int:
    """Bytes ``none`` holds at the turn from forward to backward pass, from shapes and a trace.

    The inputs (weights, optimizer state, batch, accumulator) and every residual that is not
    an input are live together there, so the compiled peak of ``none`` is at least that: when
    it is over the budget, ``none`` is not compiled first, only where no plan fits (a traced
    residual XLA never materialises, a parameter's transpose fused into its matmul, makes it
    overstate: the llama3.2-1b preset's tied head, 501 MiB).
    """
    if not workload.plannable:
        return 0  # nothing traced to bound it with: compile it
    parts = workload.breakdown(batch)
    inputs = sum(v for k, v in parts.items() if k in FIXED_PARTS and k != "gradients")
    res = workload.traced_residuals(NO_REMAT, NO_SCHEDULE, batch)
    return inputs + sum(
        r.nbytes for r in res.residuals if r.name != "argument" and r.kind == "saved"
    )


def check_plan_args(
    workload: Workload, batch: int, *, hide: float, host_budget: Any, objective: str
) -> None:
    """What :func:`plan` refuses before it compiles anything: a batch the workload cannot
    split, ``hide`` outside [0, 1], a bad host budget or objective (for searches that
    compile the programs beside a plan ahead of it).

    Raises:
      ValueError: any of them, naming the value.
      TypeError: a host budget that is not an int of bytes.
    """
    _check_batch(workload, batch)
    if not 0.0 <= hide <= 1.0:
        raise BadValue(f"hide={hide!r} must be in [0, 1]", param="hide")
    _check_host_budget(host_budget)
    _check_objective(objective)


def _check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise BadValue(
            f"objective={objective!r} is not one of {', '.join(OBJECTIVES)}", param="objective"
        )


def _check_host_budget(host_budget: Any) -> None:
    if host_budget is None:
        return
    if isinstance(host_budget, bool) or not isinstance(host_budget, int):
        raise BadType(
            f"host_budget must be an int of bytes (see rk.parse_budget) or None, got "
            f"{host_budget!r}",
            param="host_budget",
        )
    if host_budget < 0:
        raise BadValue(
            f"host_budget={host_budget} must be >= 0 bytes (0: no offload)", param="host_budget"
        )


def _as_extra(p: Any) -> tuple[Policy, Schedule]:
    if isinstance(p, tuple) and len(p) == 2:
        return as_policy(p[0]), parse_schedule(p[1])
    return as_policy(p), NO_SCHEDULE


def _chose(sol: Solution, status: SolverStatus) -> dict[str, Any]:
    """What the solver chose and how sure it is, for the plan's note: the decisions, those of
    the first ``layers`` layers where they differ, and the solver's status."""
    return {
        "decisions": dict(sol.decisions),
        "layer_decisions": {t: d for t, d in sol.first.items() if sol.decisions.get(t) != d},
        "layers": sol.layers,
        "optimal": status.optimal,
        "status": status.status,
        "gap": status.gap,
        "solver": status.solver,
        "programs": status.programs,
    }


def _check_batch(workload: Workload, batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise BadValue(f"batch={batch!r} must be a positive int", param="batch")
    if batch % max(1, workload.batch_multiple):
        raise BadValue(
            f"batch={batch} is not a multiple of {workload.batch_multiple} (accumulation steps)",
            param="batch",
        )


class _PlanContext:
    """The compiles of one plan() call, and how to turn the chosen one into a Plan."""

    def __init__(
        self,
        workload: Workload,
        batch: int,
        budget: int,
        hide: float,
        host_budget: int | None,
        objective: str,
    ) -> None:
        self.workload, self.batch, self.budget, self.hide = workload, batch, budget, hide
        self.host_budget, self.objective = host_budget, objective
        self.candidates: list[PlanCandidate] = []
        self._objects: dict[tuple[str, str], tuple[Policy, Schedule]] = {}

    def compile(
        self, pol: Policy, sch: Schedule, label: str, estimate: int | None = None
    ) -> PlanCandidate:
        w = self.workload
        # A peak read off shallow copies near the budget is compiled whole before it counts.
        r = w.verified(pol, sch, self.batch, self.budget)
        host = host_bytes(r)
        cand = PlanCandidate(
            label=label,
            policy=pol.spec,
            schedule=sch.spec,
            peak_bytes=r.peak_bytes,
            estimated_peak_bytes=estimate,
            recompute_overhead=w.recompute_of(pol, sch, self.batch),
            overhead=w.overhead_of(r, self.batch, self.hide, self.objective),
            host_bytes=host,
            fits=r.peak_bytes <= self.budget
            and (self.host_budget is None or host <= self.host_budget),
        )
        self.candidates.append(cand)
        self._objects[(cand.policy, cand.schedule)] = (pol, sch)
        return cand

    def result(
        self,
        cand: PlanCandidate,
        before: int,
        t0: float,
        *,
        fits: bool = True,
        solver: SolverStatus | None = None,
        source: str,
        chose: Mapping[str, Any] | None = None,
    ) -> Plan:
        w = self.workload
        pol, sch = self._objects[(cand.policy, cand.schedule)]
        r = w.compiled(pol, sch, self.batch)
        if fits:
            # The answer is final: its figures are the full step's (far from the budget the
            # verdict stands; near it compile() verified it already).
            r = w.verified(pol, sch, self.batch)
            host = host_bytes(r)
            ok = r.peak_bytes <= self.budget and (
                self.host_budget is None or host <= self.host_budget
            )
            cand = dataclasses.replace(cand, peak_bytes=r.peak_bytes, host_bytes=host, fits=ok)
            fits = ok
        decisions, layer_dec, layers = _decisions(
            w, self.batch, pol, sch, _decided(w, r, self.batch)
        )
        if fits:
            note = Note(
                "plan_fits",
                {
                    "policy": pol.spec,
                    "schedule": sch.spec,
                    "budget_bytes": self.budget,
                    "peak_bytes": cand.peak_bytes,
                    "recompute_overhead": cand.recompute_overhead,
                    "source": source,  # why this plan: see Plan.source
                    "solver": chose,  # what the solver chose (source "solver" only)
                },
            )
        else:
            note = Note(
                "plan_nothing_fits",
                {
                    "target": w.target.name,
                    "batch": self.batch,
                    "budget_bytes": self.budget,
                    "peak_bytes": cand.peak_bytes,
                    "policy": cand.policy,
                    "schedule": cand.schedule,
                },
            )
        return Plan(
            policy=pol,
            schedule=sch,
            decisions=decisions,
            layer_decisions=layer_dec,
            layers=layers,
            batch=self.batch,
            budget_bytes=self.budget,
            peak_bytes=cand.peak_bytes,
            fits=fits and cand.fits,
            recompute_overhead=cand.recompute_overhead,
            overhead=cand.overhead,
            host_bytes=cand.host_bytes,
            transfer_seconds=w.transfer_seconds(cand.host_bytes),
            candidates=tuple(self.candidates),
            compiles=w.compiles - before,
            seconds=time.perf_counter() - t0,
            note=note,
            host_budget_bytes=self.host_budget,
            solver=solver,
            source=source,
            objective=self.objective,
            report=r,
        )


def _decided(w: Workload, r: Any, batch: int) -> tuple[str, ...]:
    """The report's tags a policy decides on: those inside a checkpoint (a tag outside every
    checkpoint, the head after the stack, is kept whatever the policy says)."""
    if not w.plannable:
        return tuple(r.tags)
    inside = w.traced_residuals(FULL, NO_SCHEDULE, batch).checkpointed
    return tuple(t for t in r.tags if not inside or t in inside)


def _decisions(
    w: Workload, batch: int, pol: Policy, sch: Schedule, tags: Iterable[str]
) -> tuple[dict[str, str], dict[str, str], int]:
    """What the recommended policy (and a two-run ``layers`` schedule) does with each tag.

    Returns ``(decisions, layer_decisions, layers)``: decisions of the policy that runs the
    layers after the first ``layers``, and those of the first ``layers`` where they differ.
    """
    tags = tuple(tags)
    runs = sch.runs(max(1, int(w.n_layers)), pol) if sch.name == "layers" else []
    if len(runs) == 2 and all(len(run.lengths) == 1 for run in runs):
        first, rest = runs
        decisions = _tag_decisions(w, batch, rest.policy, tags)
        upper = _tag_decisions(w, batch, first.policy, tags)
        diff = {t: d for t, d in upper.items() if decisions.get(t) != d}
        return decisions, diff, first.layers if diff else 0
    return _tag_decisions(w, batch, pol, tags), {}, 0


def _tag_decisions(w: Workload, batch: int, pol: Policy, tags: Sequence[str]) -> dict[str, str]:
    """Per tag: ``save``, ``recompute`` or ``offload`` under ``pol``.

    Name-based policies say it by name (``rk.decide``). Pattern policies (``dots`` keeps every
    matmul output, whatever its name) cannot be asked by name: their decisions are read from
    the traced residuals of the step.
    """
    if not pol.is_remat:
        return dict.fromkeys(tags, "save")
    if pol.tags or pol.name == "full" or not w.plannable:
        return {t: decide(pol, t) for t in tags}
    traced = w.traced_residuals(pol, NO_SCHEDULE, batch).tags
    word = {"saved": "save", "offloaded": "offload", "not needed": "save"}
    return {t: word.get(traced.get(t, "recomputed"), "recompute") for t in tags}


def _solve_and_verify(
    ctx: _PlanContext, model: CostModel, max_compiles: int
) -> tuple[PlanCandidate | None, Solution | None, SolverStatus | None]:
    """Steps 3 and 4 of :func:`plan`: solve, compile, correct the offset, solve again.

    The offset is what a compiled peak holds besides the modelled residuals. Its first guess
    is the fixed parts less the untagged residuals (the weights are residuals of the step too),
    or what an earlier plan on this workload and batch measured; every compile replaces it.
    Plans with a layer split carry an offset of their own (two scans over two slices of the
    stacked weights cost memory a single scan does not): they are solved for only once a plan
    without a split fits, starting from the split's extra as an earlier plan measured it, else
    none.

    Returns the best compiled candidate that fits (None if none did), the solution it came
    from, and the status of the proof: the last program solved, which is ``optimal`` only when
    it shows nothing cheaper than that candidate meets the corrected caps.
    """
    w, budget, batch = ctx.workload, ctx.budget, ctx.batch
    memo = w.memo
    guess = max(0, w.fixed_bytes(batch) - model.untagged_bytes)
    whole_offset = memo.get(("plan offset", batch), guess)
    split_extra = memo.get(("plan split extra", batch), 0)
    split_offset: float | None = None
    host_cap = None if ctx.host_budget is None else float(ctx.host_budget)
    best: tuple[PlanCandidate, Solution] | None = None
    status: SolverStatus  # the loop solves before anything else: always set after it
    proven = False
    floor_tried = False
    compiles = 0
    while True:
        splits = best is not None and model.n_layers > 1 and w.supports("layers")
        shift_split = split_offset if split_offset is not None else whole_offset + split_extra
        sol, status = solve(
            model, budget - whole_offset, budget - shift_split, host_cap, splits=splits
        )
        if sol is None:
            if best is not None or floor_tried:
                break
            # The model says nothing fits: compile its smallest point, which also calibrates it.
            floor_tried = True
            sol = _all_recomputed(model)
        elif best is not None and sol.estimate.overhead >= best[1].estimate.overhead * (1 - 1e-12):
            proven = status.optimal  # nothing cheaper than the best compiled plan
            break
        pol, sch = sol.policies()
        if (pol.spec, sch.spec) in ctx._objects or compiles >= max_compiles:
            break  # compiled already (the model has nothing new to try), or out of compiles
        shift = shift_split if sol.layers else whole_offset
        label = "smallest" if floor_tried and best is None else f"solver {compiles + 1}"
        cand = ctx.compile(pol, sch, label, int(sol.estimate.device_bytes + shift))
        compiles += 1
        measured = cand.peak_bytes - int(sol.estimate.device_bytes)
        if sol.layers:
            split_offset = measured
            memo[("plan split extra", batch)] = max(0, measured - whole_offset)
        else:
            whole_offset = measured
            memo[("plan offset", batch)] = measured
        if cand.fits and (best is None or cand.overhead < best[0].overhead):
            best = (cand, sol)
    if best is None:
        return None, None, status
    return best[0], best[1], _proof(best[1], status, proven, compiles >= max_compiles)


def _proof(sol: Solution, last: SolverStatus, proven: bool, spent: bool) -> SolverStatus:
    """The solver status reported with a plan: the last program, measured against the plan."""
    objective = sol.estimate.overhead
    bound = None if last.bound is None else min(last.bound, objective)
    if proven:
        return dataclasses.replace(last, objective=objective, bound=bound, gap=0.0)
    why = "compile limit" if spent else last.status if last.status != "optimal" else "stopped"
    gap = None if bound is None else max(0.0, objective - bound) / max(abs(objective), 1e-12)
    return dataclasses.replace(
        last, status=why, optimal=False, objective=objective, bound=bound, gap=gap
    )


def _all_recomputed(model: CostModel) -> Solution:
    """Every tag that can be read by the backward pass recomputed: ``full``."""
    dec = {t: "recompute" if model.can_be_needed(t) else "save" for t in model.tags}
    return Solution(dec, dec, 0, model.evaluate(dec))


def _segment_fallback(ctx: _PlanContext) -> PlanCandidate | None:
    """``full``, then with segment schedules, cheapest FLOPs first; the first that fits.

    ``full`` comes first: it is the smallest per-layer policy.
    """
    w, full = ctx.workload, FULL
    options = [parse_schedule(s) for s in FALLBACK_SCHEDULES]
    # Only schedules the model's depth can take (every:2 needs two layers, nested:3 four) and
    # its source can build (a factory's model may take none).
    options = [s for s in options if _fits_depth(s, w.n_layers) and w.supports(s)]
    options.sort(key=lambda s: w.traced_flops(full, s, ctx.batch))
    for sch in options:
        got = ctx.compile(full, sch, "schedule")
        if got.fits:
            return got
    return None


def _fits_depth(sch: Schedule, n_layers: int) -> bool:
    if sch.name == "nested" and n_layers < 4:
        return False  # two or three levels of segments over under four layers: every:2 again
    try:
        sch.runs(n_layers, FULL)
    except BadValue:
        return False
    return True


def _best_of(
    ctx: _PlanContext, best: PlanCandidate, extras: Sequence[tuple[Policy, Schedule]]
) -> PlanCandidate:
    """``best``, or a policy in ``extras`` that fits and is cheaper, or as cheap and smaller.

    In FLOPs only extras whose traced recompute is not above ``best``'s overhead can be as
    cheap, so only those are compiled; in time all are. The result is never dominated
    (smaller peak and no higher overhead) by an extra.
    """
    w = ctx.workload

    def tol(x: float) -> float:
        return _RTOL * max(1.0, abs(x))

    def bound(p: Policy, s: Schedule) -> float:
        # A traced recompute that is not a number (a measured source's FLOP count) bounds
        # nothing: compiled, first. Sorted as NaN, its place would hang on the order of extras.
        r = w.recompute_of(p, s, ctx.batch)
        return r if not math.isnan(r) else -math.inf

    ranked = sorted(
        (bound(p, s), i, p, s)
        for i, (p, s) in enumerate(extras)
        if (p.is_remat or s.name != "none") and w.supports(s)
    )
    fitting = [best]
    for recompute, _, p, s in ranked:
        # In FLOPs an extra's traced recompute bounds its overhead from below; in time nothing
        # traced does (recomputing can be faster than saving), so every extra is compiled.
        if ctx.objective == "flops" and recompute > best.overhead + tol(best.overhead):
            break
        got = ctx.compile(p, s, "catalogue")
        if got.fits:
            fitting.append(got)
    cheapest = min(c.overhead for c in fitting)
    near = [c for c in fitting if c.overhead <= cheapest + tol(cheapest)]
    # Among the cheapest, the smallest; on a tie a catalogue name wins over the solver's
    # names:save=... list (the same figures: a user reads `minimal`, not 110 characters).
    chosen = min(near, key=lambda c: (c.peak_bytes, c is best and best.label != "none"))
    if chosen is not best or best.label == "none":
        return chosen
    # The same compiled program under a catalogue name (a fingerprint XLA's output gives)
    # is that name, whatever float noise the overhead estimates carry.
    program = _program(ctx, best)
    same = [c for c in fitting[1:] if program is not None and _program(ctx, c) == program]
    return same[0] if same else best


def _program(ctx: _PlanContext, cand: PlanCandidate) -> str | None:
    """The compiled program's fingerprint of a candidate (its report is cached: no compile)."""
    pol, sch = ctx._objects[(cand.policy, cand.schedule)]
    return ctx.workload.compiled(pol, sch, ctx.batch).meta.program
