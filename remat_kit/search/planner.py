"""The planner: the cheapest plan whose compiled peak fits a memory budget.

:func:`plan` walks the greedy sequence of :mod:`remat_kit.search._greedy` (traced only) and
compiles as few points of it as it can; the algorithm is in its docstring.

Example:
  >>> import remat_kit as rk                                           # doctest: +SKIP
  >>> from models.measure import Options, workload
  >>> w = workload(Options("llama3-8b", batch=4, seq=2048, optimizer="sgd"), "h100")
  >>> p = rk.plan(w, batch=4, budget=rk.parse_budget("52GiB", w.target.memory_bytes))
  >>> p.fits, p.policy.spec, p.schedule.spec
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from remat_kit.analysis import MemoryReport
from remat_kit.policies import Policy, as_policy, decide
from remat_kit.schedules import Schedule, label, parse_schedule
from remat_kit.search._greedy import Positions, State, moves, sequence
from remat_kit.search.budget import DEFAULT_HEADROOM, GIB, check_budget, limit_for
from remat_kit.search.workload import (
    DEFAULT_HIDE,
    FULL,
    NO_REMAT,
    NO_SCHEDULE,
    Workload,
    host_bytes,
)

__all__ = [
    "Plan",
    "PlanCandidate",
    "plan",
]


@dataclasses.dataclass(frozen=True)
class PlanCandidate:
    """One program the planner compiled.

    Attributes:
      label: how the planner got it (``none``, ``greedy x=...``, ``catalogue``, ``schedule``).
      policy, schedule: specs.
      peak_bytes: compiled peak.
      estimated_peak_bytes: the planner's estimate before compiling (None when it had none).
      recompute_overhead: extra FLOPs of recomputation (traced).
      overhead: estimated step-time overhead (recompute plus host transfer not hidden).
      host_bytes: bytes offloaded to host memory.
      fits: compiled peak <= budget.
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
        recompute or offload one tensor more than the rest; or a segment schedule.
      decisions: tag -> ``"save" | "recompute" | "offload"`` under ``policy``.
      layer_decisions: tag -> decision in the first ``layers`` layers, where it differs.
      layers: how many layers follow ``layer_decisions`` (0: none).
      batch: the batch planned for.
      budget_bytes: the budget.
      peak_bytes: compiled peak of the plan (the smallest reached when nothing fits).
      fits: ``peak_bytes <= budget_bytes``.
      recompute_overhead: extra FLOPs of recomputation against no remat.
      overhead: estimated step-time overhead (recompute plus host transfer not hidden).
      host_bytes: bytes offloaded to host per step.
      transfer_seconds: their estimated round trip over the host link.
      candidates: every program compiled, in order.
      compiles: programs compiled for this plan (cached ones not counted).
      seconds: wall time.
      message: one line for the user: what the plan is, or why nothing fits.
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
    message: str
    report: MemoryReport | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``policy`` or ``policy @ schedule``."""
        return label(self.policy.spec, self.schedule.spec)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (policy and schedule as specs)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("policy", "schedule", "candidates", "report")
        }
        out.update(
            policy=self.policy.spec,
            schedule=self.schedule.spec,
            decisions=dict(self.decisions),
            layer_decisions=dict(self.layer_decisions),
            candidates=[dataclasses.asdict(c) for c in self.candidates],
        )
        return out


def plan(
    workload: Workload,
    batch: int,
    budget: int | None = None,
    *,
    headroom: float = DEFAULT_HEADROOM,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
    max_compiles: int = 8,
) -> Plan:
    """The plan with the lowest estimated overhead whose compiled peak fits ``budget``.

    The algorithm:

    1. ``none`` (no remat) is compiled first: if it fits, it is the plan, at zero overhead.
    2. A greedy sequence of one-tag decisions from "save every tagged tensor" to "save none":
       at each step every still-saved tag is tried as recomputed, the bytes it frees read from
       the traced residuals and its cost from the traced FLOPs (trace only, no compile), and
       the tag freeing the most bytes per extra FLOP is taken. That is the greedy for a
       fractional knapsack (bytes to shed, FLOPs as the cost), which is optimal when items
       are divisible - and step 4 makes them divisible by layer. Marginal figures at every
       step, rather than each tag's cost against "save everything" once, keep interactions
       honest: recomputing ``attn_out`` frees nothing while ``out_proj`` is kept for it.
    3. Offload (``offload=True``): an offloaded tensor crosses the host link twice per step.
       Transfers of up to ``hide`` x the step's compute time (at peak bf16) count as hidden
       behind compute, so free; within that window the tags that are the most expensive to
       recompute per byte are offloaded instead, right after the free recomputations. Offload
       that would not hide is never chosen.
    4. Positions are continuous in layers: ``x = i * L + k`` is greedy state ``i`` with its
       first ``k`` layers already at state ``i + 1`` (a ``layers`` schedule), so the plan sheds
       the bytes it must and not a whole tag more.
    5. Verification by compiling: the end of the sequence (everything recomputed or
       offloaded) is compiled; if even it does not fit, ``full`` and its segment schedules
       (``sqrt``, ``every:2``, ``nested:2/3``) are compiled in order of FLOPs. Otherwise the
       smallest ``x`` whose estimated peak fits is compiled; the estimate (compiled peak of
       a neighbour plus the residual bytes between them, a secant once two points are known)
       is corrected by every compiled peak, and the search narrows between the largest ``x``
       known not to fit and the smallest known to fit - a candidate over budget tightens it -
       for at most ``max_compiles`` compiles. A plan is only returned on a compiled peak.
    6. Policies in ``extra`` (e.g. the catalogue) whose traced overhead is below the plan's
       are compiled and taken if they fit, so the plan is never worse than what it is shown.

    Args:
      workload: the step (needs ``residuals_fn``).
      batch: the batch to plan for.
      budget: bytes (see :func:`parse_budget`); default device memory minus ``headroom``.
      headroom: used only when ``budget`` is None.
      offload: allow offloading to host memory (only where transfers hide behind compute).
      hide: fraction of the step's compute time transfers may take and count as hidden.
      extra: policies (names, specs or Policies) to compare against, e.g. the catalogue.
      max_compiles: compiles allowed for the search of step 5.

    Returns:
      The Plan. ``fits`` is False when nothing reaches the budget; ``message`` then gives the
      smallest peak reached and with what.

    Raises:
      DoesNotFit: a budget below weights + gradients + optimizer state (a ValueError; it
        carries the breakdown and what would fit, see :func:`check_budget`).
      ValueError: budget above the device memory; a batch that is not a positive multiple of
        the accumulation steps.

    Example:
      >>> budget = rk.parse_budget("52GiB", w.target.memory_bytes)          # doctest: +SKIP
      >>> p = rk.plan(w, batch=4, budget=budget)
      >>> cfg = models.get_config("llama3-8b", policy=p.policy, schedule=p.schedule)
    """
    t0 = time.perf_counter()
    before = workload.compiles
    _check_batch(workload, batch)
    if not 0.0 <= hide <= 1.0:
        raise ValueError(f"hide={hide!r} must be in [0, 1]")
    budget = limit_for(workload.target, budget, headroom)
    check_budget(workload, batch, budget)
    extras = [as_policy(p) for p in extra]
    ctx = _PlanContext(workload, batch, budget, hide)

    none = ctx.compile(NO_REMAT, NO_SCHEDULE, "none")
    if none.fits:
        return ctx.result(none, before, t0, "no remat needed")

    states = sequence(workload, batch, offload=offload, hide=hide)
    pos = Positions(states, max(1, int(workload.n_layers)))
    end = ctx.compile(*pos.candidate(pos.last), f"greedy x={pos.last}")
    best, best_x = (end, pos.last) if end.fits else (None, None)
    if best is not None:
        best, best_x = _search(ctx, pos, end, max_compiles)
    else:
        best = _segment_fallback(ctx)

    if best is None:
        smallest = min(ctx.candidates, key=lambda c: c.peak_bytes)
        msg = (
            f"nothing fits {budget / GIB:.2f} GiB on {workload.target.name} at batch {batch}: "
            f"the smallest peak reached is {smallest.peak_bytes / GIB:.2f} GiB, with "
            f"{label(smallest.policy, smallest.schedule)} "
            f"({(smallest.peak_bytes - budget) / GIB:.2f} GiB over); try a smaller batch "
            "(remat-kit fit), gradient accumulation or a larger budget"
        )
        return ctx.result(smallest, before, t0, msg, fits=False)
    cheaper = _cheaper_extra(ctx, best, extras)
    if cheaper is not best:
        return ctx.result(cheaper, before, t0, "a policy given to compare is cheaper")
    if best_x is None:
        return ctx.result(best, before, t0, "segment checkpointing")
    if best_x < 0:
        last = best.label.removeprefix("repair: ")
        return ctx.result(best, before, t0, f"the greedy order, with {last} as its last step")
    i, k = pos.split(best_x)
    steps = [s.step for s in states[1 : i + 1]]
    why = "save every tagged tensor" + (", then " + ", ".join(steps) if steps else "")
    if k:
        why += f"; layers 0-{k - 1} also {states[i + 1].step}"
    return ctx.result(best, before, t0, why, upper=states[i + 1] if k else None, layers=k)


def _check_batch(workload: Workload, batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch={batch!r} must be a positive int")
    if batch % max(1, workload.batch_multiple):
        raise ValueError(
            f"batch={batch} is not a multiple of {workload.batch_multiple} (accumulation steps)"
        )


class _PlanContext:
    """The compiles of one plan() call, and how to turn the chosen one into a Plan."""

    def __init__(self, workload: Workload, batch: int, budget: int, hide: float) -> None:
        self.workload, self.batch, self.budget, self.hide = workload, batch, budget, hide
        self.candidates: list[PlanCandidate] = []
        self._objects: dict[tuple[str, str], tuple[Policy, Schedule]] = {}

    def compile(
        self, pol: Policy, sch: Schedule, label: str, estimate: int | None = None
    ) -> PlanCandidate:
        w = self.workload
        r = w._compiled(pol, sch, self.batch)
        cand = PlanCandidate(
            label=label,
            policy=pol.spec,
            schedule=sch.spec,
            peak_bytes=r.peak_bytes,
            estimated_peak_bytes=estimate,
            recompute_overhead=w._recompute(pol, sch, self.batch),
            overhead=w.overhead_of(r, self.batch, self.hide),
            host_bytes=host_bytes(r),
            fits=r.peak_bytes <= self.budget,
        )
        self.candidates.append(cand)
        self._objects[(cand.policy, cand.schedule)] = (pol, sch)
        return cand

    def result(
        self,
        cand: PlanCandidate,
        before: int,
        t0: float,
        why: str,
        *,
        fits: bool = True,
        upper: State | None = None,
        layers: int = 0,
    ) -> Plan:
        w = self.workload
        pol, sch = self._objects[(cand.policy, cand.schedule)]
        r = w._compiled(pol, sch, self.batch)
        tags = r.tags
        decisions = _decisions(pol, tags)
        layer_dec: dict[str, str] = {}
        if upper is not None:
            up = _decisions(upper.policy, tags)
            layer_dec = {t: d for t, d in up.items() if decisions.get(t) != d}
        if fits:
            message = (
                f"{label(pol.spec, sch.spec)} fits {self.budget / GIB:.2f} GiB: peak "
                f"{cand.peak_bytes / GIB:.2f} GiB, recompute "
                f"{100 * cand.recompute_overhead:.1f}% ({why})"
            )
        else:
            message = why
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
            message=message,
            report=r,
        )


def _decisions(pol: Policy, tags: Iterable[str]) -> dict[str, str]:
    if not pol.is_remat:
        return {t: "save" for t in tags}
    return {t: decide(pol, t) for t in tags}


def _search(
    ctx: _PlanContext, pos: Positions, end: PlanCandidate, max_compiles: int
) -> tuple[PlanCandidate, int]:
    """Step 5 of :func:`plan`: the smallest position whose compiled peak fits.

    Whole greedy states first (``k = 0``); then, between the last state that does not fit and
    the first that does, layer splits. A split runs the stack as two scans, which can cost
    memory of its own (gradients of the two weight slices); the excess seen in a compiled split
    over the straight-line estimate is added to the next predictions.
    """
    budget, L = ctx.budget, pos.L
    known: dict[int, int] = {pos.last: end.peak_bytes}
    best, best_x = end, pos.last
    lo = -L  # the largest whole state known not to fit (-L: below "save all")
    compiles = 0
    while compiles < max_compiles:
        probe = next(
            (
                x
                for x in range(lo + L, best_x, L)
                if x not in known and pos.predict(known, x) <= budget
            ),
            None,
        )
        if probe is None:
            break
        got = ctx.compile(*pos.candidate(probe), f"greedy x={probe}", pos.predict(known, probe))
        compiles += 1
        known[probe] = got.peak_bytes
        if got.fits:
            best, best_x = got, probe
        else:
            lo = max(lo, probe)
    if best_x < L:
        return best, best_x
    # Greedy by ratio may take a big step where a smaller, cheaper one would do (a knapsack
    # item that overshoots): from the last state that does not fit, try the cheapest single
    # move that frees enough, by its traced bytes and FLOPs.
    prev_x = best_x - L
    prev = pos.states[prev_x // L]
    need = (known[prev_x] if prev_x in known else pos.predict(known, prev_x)) - budget
    for nxt, freed in sorted(moves(ctx.workload, ctx.batch, prev), key=lambda m: m[0].flops):
        if nxt.flops >= pos.states[best_x // L].flops or compiles >= max_compiles:
            break
        if freed < need:
            continue
        got = ctx.compile(nxt.policy, NO_SCHEDULE, f"repair: {nxt.step}")
        compiles += 1
        if got.fits and got.overhead < best.overhead:
            return got, -1  # not on the sequence
        break
    if L == 1:
        return best, best_x
    # Layer splits between the state before (does not fit) and best_x's (fits).
    whole = {x: p for x, p in known.items() if x % L == 0}
    penalty, hi, lo = 0, best_x, prev_x
    while compiles < max_compiles:
        probe = next(
            (
                x
                for x in range(lo + 1, hi)
                if x not in known and pos.predict(whole, x, penalty) <= budget
            ),
            None,
        )
        if probe is None:
            break
        estimate = pos.predict(whole, probe, penalty)
        got = ctx.compile(*pos.candidate(probe), f"greedy x={probe}", estimate)
        compiles += 1
        known[probe] = got.peak_bytes
        penalty = max(penalty, got.peak_bytes - pos.predict(whole, probe))
        if got.fits:
            hi = probe
            if got.overhead < best.overhead:
                best, best_x = got, probe
    return best, best_x


def _segment_fallback(ctx: _PlanContext) -> PlanCandidate | None:
    """``full``, then with segment schedules, cheapest FLOPs first; the first that fits.

    ``full`` comes first: the greedy's end point can keep tags whose recomputation frees
    nothing on its own (``decoder_layer_input``) or offload buffers, so it is not always the
    smallest per-layer policy.
    """
    w, full = ctx.workload, FULL
    options = [parse_schedule(s) for s in ("none", "sqrt", "every:2", "nested:2", "nested:3")]
    if w.n_layers < 4:
        options = options[:3]
    options.sort(key=lambda s: w._traced_flops(full, s, ctx.batch))
    for sch in options:
        got = ctx.compile(full, sch, "schedule")
        if got.fits:
            return got
    return None


def _cheaper_extra(
    ctx: _PlanContext, best: PlanCandidate, extras: Sequence[Policy]
) -> PlanCandidate:
    """The cheapest policy in ``extras`` that fits and beats ``best``, else ``best``."""
    w, none = ctx.workload, NO_SCHEDULE
    ranked = sorted(
        (w._recompute(p, none, ctx.batch), i, p) for i, p in enumerate(extras) if p.is_remat
    )
    for recompute, _, p in ranked:
        if recompute >= best.overhead - 1e-9:
            break
        got = ctx.compile(p, none, "catalogue")
        if got.fits and got.overhead < best.overhead - 1e-9:
            best = got
    return best
