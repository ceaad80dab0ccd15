"""The largest batch: for one policy (:func:`max_batch`) or for any plan (:func:`max_batch_plan`).

Example:
  >>> fit = rk.max_batch(w, "full", limit_bytes=2**20)
  >>> fit.max_batch > 2, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes
  (True, True)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from jax.errors import JaxRuntimeError

from remat_kit.notes import Note
from remat_kit.policies import Policy, PolicyLike, as_policy
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.search._boundary import UNBUILDABLE, bracket, plan_at
from remat_kit.search._budget import DEFAULT_HEADROOM, limit_for
from remat_kit.search._fit import NotedFit
from remat_kit.search._planner import Plan
from remat_kit.search._workload import DEFAULT_HIDE, FIXED_PARTS, FULL, Workload

#: How far (a fraction) the first peak read off shallow copies may be from the full step's
#: for the search to go on with copies. Measured on a 2048-wide Llama, 32 layers, under
#: ``full``: 0.03% at batch 1, but at batch 4 and 17 the copies' lines were 2.3x over.
COPIES_TOLERANCE = 0.02

__all__ = [
    "BatchFit",
    "max_batch",
    "max_batch_plan",
]


@dataclasses.dataclass(frozen=True)
class BatchFit(NotedFit):
    """The largest batch that fits, for one policy and schedule.

    Attributes:
      policy, schedule: what was measured (specs).
      max_batch: the largest batch whose compiled peak is within ``limit_bytes`` (0: even the
        smallest batch does not fit).
      peak_bytes: compiled peak at ``max_batch`` (at the smallest batch when it is 0).
      next_peak_bytes: compiled peak at the next larger batch (the proof it does not fit), or
        None when the search stopped at ``cap`` or XLA could not build that batch (the message
        then says so).
      limit_bytes: device memory minus headroom.
      recompute_overhead: extra FLOPs of recomputation at ``max_batch``.
      tokens_per_step: ``max_batch`` x sequence length.
      compiles: programs compiled for this search (cached ones not counted).
      seconds: wall time of the search.
      xla_remat: XLA's own rematerialization pass changed the program at ``max_batch``.
      note: what the search found, as data (kind ``batch_fits``, ``batch_none_fits`` or
        ``plan_at_max_batch``); ``message`` is its words.
      predicted_batch: the batch the straight line through the first two compiled peaks
        predicted (None when it could not: a peak that does not grow with the batch).
      method: how the boundary was found: ``line`` (the prediction held: two compiles to fit
        the line, one or two to verify, often one of them shared: three), ``two lines`` (the
        line overshot, as it does where the peak moves to the end of the forward pass at
        large batches; a second line from the inputs through the failed point held: five
        compiles), ``bisection`` (neither held, or
        there was no line), or ``cap``.
    """

    policy: str
    schedule: str
    max_batch: int
    peak_bytes: int
    next_peak_bytes: int | None
    limit_bytes: int
    recompute_overhead: float | None
    tokens_per_step: int
    compiles: int
    seconds: float
    xla_remat: bool = False
    note: Note | None = None
    predicted_batch: int | None = None
    method: str = ""

    @property
    def fits(self) -> bool:
        """At least the smallest batch fits."""
        return self.max_batch > 0


def max_batch(
    workload: Workload,
    policy: PolicyLike = "full",
    schedule: Any = "none",
    *,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = 1 << 14,
) -> BatchFit:
    """The largest batch whose compiled peak fits the device minus ``headroom``.

    Peak memory is close to affine in the batch for a fixed policy and schedule (activations
    grow with it, the rest is constant), so the search fits a line and verifies it:

    1. two compiles give a line. The first is at ``start``; without one, where the inputs
       (shapes) plus the residuals the step saves per sample (a trace) reach the limit, which
       is at or just past the boundary. The second is where that compile puts the boundary:
       on the line from the inputs through it when it does not fit (a large batch peaks at
       the end of the forward pass), else from the activations per sample it shows besides
       the fixed parts (without a ``breakdown_fn``: twice ``start``, or half);
    2. the line predicts the largest batch ``b`` under the limit;
    3. ``b`` and ``b + 1`` are compiled: when ``b`` fits and ``b + 1`` does not, that is the
       answer (four compiles in all);
    4. otherwise the known bounds are narrowed by alternating secant and bisection steps (each
       step at least halves the bracket every second compile), after doubling from the largest
       known fit when no batch is known not to fit.

    Every probe is a compiled report for the workload's target, cached in the workload; the
    answer always rests on two compiled peaks, ``b`` fitting and ``b + 1`` not (or ``cap``).
    Where a probe's peak was read off shallow copies of an unrolled model
    (``Workload.verify_fn``), those two are compiled whole, and the search goes on where
    that moves the boundary.

    Args:
      workload: the step to compile.
      policy: policy name/spec or Policy.
      schedule: layer schedule spec or Schedule.
      headroom: fraction of device memory left free (see ``DEFAULT_HEADROOM``).
      limit_bytes: an explicit limit instead of device memory minus headroom.
      start: first batch probed (rounded to ``workload.batch_multiple``); default the traced
        estimate above, or the multiple without a ``residuals_fn``.
      cap: stop searching above this batch.

    Returns:
      A BatchFit; ``max_batch == 0`` when even the smallest batch does not fit. ``compiles``
      counts the programs compiled for it, ``method`` says whether the line held.

    Raises:
      ValueError: a target without a memory size and no ``limit_bytes``; a bad headroom.

    Example:
      >>> fit = rk.max_batch(w, "full", limit_bytes=2**20)  # 1 MiB for this tiny step
      >>> fit.max_batch > 1, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes, fit.method
      (True, True, 'line')
    """
    t0 = time.perf_counter()
    before = workload.compiles
    pol, sch = as_policy(policy), parse_schedule(schedule)
    limit = (
        limit_for(workload.target, limit_bytes, headroom) if limit_bytes is None else limit_bytes
    )
    step = max(1, int(workload.batch_multiple))
    units_cap = max(1, cap // step)
    known: dict[int, int] = {}  # units -> compiled peak
    unbuildable: dict[int, str] = {}  # units -> XLA's refusal
    exact: set[int] = set()  # units whose peak is the full step's (not read off copies)
    copies: list[bool] = []  # [held]: whether the copies' peak held where first checked

    def whole(units: int) -> int:
        # The full step's peak: a copies' figure is compiled whole (Workload.verify_fn);
        # once the copies were off, probes skip them. Without a verify_fn every peak is.
        if workload.verify_fn is None:
            exact.add(units)
            return peak(units)
        if units not in exact and known.get(units) != UNBUILDABLE:
            b = units * step
            r = workload.whole(pol, sch, b) if copies == [False] else workload.verified(pol, sch, b)
            known[units] = r.peak_bytes
            exact.add(units)
        return known[units]

    def peak(units: int) -> int:
        if units not in known:
            try:
                if copies == [False]:
                    return whole(units)
                r = workload.compiled(pol, sch, units * step)
                known[units] = r.peak_bytes
                checks = not copies and workload.verify_fn is not None
                if checks and workload.verified(pol, sch, units * step) is not r:
                    # The first figure from copies is checked: where the copies are far off
                    # (XLA orders a shallow step differently at this batch), a search on
                    # them would go astray, and every probe is compiled whole instead.
                    copies.append(abs(r.peak_bytes / whole(units) - 1) <= COPIES_TOLERANCE)
            except JaxRuntimeError as err:
                # A batch XLA cannot build (a kernel grid or an index past what the GPU or
                # int32 allows) does not run either: it is an upper bound. The smallest
                # batch failing is a real error.
                if units == 1:
                    raise
                known[units] = UNBUILDABLE
                unbuildable[units] = str(err).split("\n", 1)[0][:200]
        return known[units]

    first = _first_probe(workload, pol, sch, step, limit, start, units_cap)
    second = _second_probe(workload, peak(first), first, step, limit, units_cap)
    peak(second)
    if min(first, second) == 1 and peak(1) > limit and whole(1) > limit:
        return _no_fit(workload, pol, sch, step, limit, before, t0)
    predicted = _line(known, first, second, limit, units_cap)
    method = "bisection"
    if predicted is not None:
        b = max(1, min(predicted, units_cap))
        if peak(b) <= limit and (b == units_cap or peak(b + 1) > limit):
            method = "line" if b < units_cap else "cap"
        else:
            # The line missed: the peak is convex in the batch. Past a point the step peaks
            # before any gradient exists (end of the forward pass, the loss), on a steeper
            # line through what no batch changes; follow that one from the smallest batch
            # known not to fit.
            lo, hi = bracket(known, limit)
            guess = None if hi is None else _forward_line(workload, known, hi, step, limit)
            inside = guess is not None and hi is not None and lo < guess < hi
            if inside and peak(guess) <= limit and peak(guess + 1) > limit:
                method = "two lines"
    lo, hi = bracket(known, limit)
    if method == "bisection":
        lo, hi = _narrow(peak, known, limit, lo, hi, units_cap)
        if hi is None:
            method = "cap"
    verified = _verify_boundary(whole, known, exact, limit, lo, hi, units_cap)
    if verified != (lo, hi):
        method, (lo, hi) = "bisection", verified
    if lo == 0:
        return _no_fit(workload, pol, sch, step, limit, before, t0)
    best = workload.compiled(pol, sch, lo * step)
    nxt_peak = known.get(hi) if hi is not None else None
    batch = lo * step
    overhead = workload.recompute_of(pol, sch, batch)
    refusal = unbuildable.get(hi) if hi is not None else None
    if refusal is not None:
        nxt_peak = None
    note = Note(
        "batch_fits",
        {
            "policy": pol.spec,
            "schedule": sch.spec,
            "batch": batch,
            "peak_bytes": best.peak_bytes,
            "limit_bytes": limit,
            "next_batch": None if hi is None else hi * step,  # None: stopped at the cap
            "next_peak_bytes": nxt_peak,
            "unbuildable": refusal,  # XLA's refusal of the next batch
            "cap": cap,
        },
    )
    return BatchFit(
        policy=pol.spec,
        schedule=sch.spec,
        max_batch=batch,
        peak_bytes=best.peak_bytes,
        next_peak_bytes=nxt_peak,
        limit_bytes=limit,
        recompute_overhead=overhead,
        tokens_per_step=batch * workload.seq,
        compiles=workload.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=best.xla_remat,
        note=note,
        predicted_batch=None if predicted is None else predicted * step,
        method=method,
    )


def _first_probe(
    workload: Workload,
    pol: Policy,
    sch: Schedule,
    step: int,
    limit: int,
    start: int | None,
    cap: int,
) -> int:
    """The first batch to compile (in units of ``step``): ``start`` when given, else where the
    trace puts the boundary, else the smallest batch.

    The estimate needs no compile: the inputs (weights, optimizer state: shapes) plus, per
    sample, the residuals the step saves for its backward pass (a trace). At the end of the
    forward pass all of those are live, and XLA's temporaries come on top, so the estimate
    is at or above the boundary, close to it where the peak is at the end of the forward
    pass, as at the large batches of a big vocabulary. The line from the inputs through that
    compile then lands near the boundary (:func:`_second_probe`).
    """
    if start is not None:
        return min(max(1, start // step), cap)
    if workload.breakdown_fn is None or workload.residuals_fn is None:
        return 1
    try:
        res = workload.traced_residuals(pol, sch, step)
    except ValueError:  # a step the residual trace cannot read: start small, as without one
        return 1
    per_unit = sum(r.nbytes for r in res.residuals if r.name != "argument" and r.kind == "saved")
    if per_unit <= 0:
        return 1
    return int(min(cap, max(1, (limit - _inputs(workload, step)) // per_unit)))


def _inputs(workload: Workload, batch: int) -> int:
    """Bytes that are inputs whatever the batch (weights, optimizer state, accumulator: the
    fixed parts less the gradients and the batch), from shapes."""
    parts = workload.breakdown(batch)
    return sum(parts.get(k, 0) for k in FIXED_PARTS if k not in ("gradients", "batch"))


def _second_probe(
    workload: Workload, first_peak: int, first: int, step: int, limit: int, cap: int
) -> int:
    """Where to compile the second point of the line (in units of ``step``).

    Near the boundary, when the shapes say what the step holds besides activations (the
    workload's ``breakdown_fn``, no compile), so that the line is accurate there and the
    second point is often one of the two batches that verify it:

    - ``first`` fits: activations per sample are about ``(peak - fixed) / batch``, with every
      gradient among the fixed parts (small batches peak in the backward pass);
    - ``first`` does not fit: on the line from the inputs through it (large batches peak at
      the end of the forward pass, before any gradient exists).

    Otherwise twice (or, when ``first`` does not fit, half) the first batch.
    """
    fits = first_peak <= limit
    fallback = min(first * 2, cap) if fits else max(1, first // 2)
    if workload.breakdown_fn is None or first_peak >= UNBUILDABLE:
        return fallback
    if not fits:
        guess = _forward_line(workload, {first: first_peak}, first, step, limit)
        return fallback if guess is None else max(1, min(first - 1, guess))
    per_unit = (first_peak - workload.fixed_bytes(first * step)) / first
    if per_unit <= 0:
        return fallback  # small batches can hold less than the fixed parts (donated buffers)
    return min(cap, max(first + 1, first + int((limit - first_peak) // per_unit)))


def _forward_line(
    workload: Workload, known: dict[int, int], over: int, step: int, limit: int
) -> int | None:
    """The largest batch (in units) under ``limit`` on the line from the bytes that are inputs
    whatever the batch (weights, optimizer state, accumulator: the fixed parts less the
    gradients, from shapes) through the compiled peak at ``over``; None without shapes."""
    if workload.breakdown_fn is None:
        return None
    base = _inputs(workload, over * step)
    slope = (known[over] - base) / over
    if slope <= 0 or known[over] >= UNBUILDABLE:
        return None
    return int(max(1, (limit - base) // slope))


def _line(known: dict[int, int], a: int, b: int, limit: int, cap: int) -> int | None:
    """The largest batch (in units) under ``limit`` on the line through ``a`` and ``b``."""
    if a == b:
        return None
    slope = (known[b] - known[a]) / (b - a)
    if slope <= 0:
        return None  # not growing with the batch: no line to follow
    return int(min(cap, max(1, a + (limit - known[a]) // slope)))


def _verify_boundary(
    whole: Callable[[int], int],
    known: dict[int, int],
    exact: set[int],
    limit: int,
    lo: int,
    hi: int | None,
    cap: int,
) -> tuple[int, int | None]:
    """``(lo, hi)`` resting on peaks of the full step (``whole``) where some were read off
    shallow copies of an unrolled model (``Workload.verify_fn``): both sides are compiled
    whole. Where that moves the boundary the copies were off here: their peaks are
    dropped, and the search goes on from the line through the last two whole peaks, then
    by secant and bisection, compiling whole."""
    while True:
        for units in (lo, hi):
            if units:
                whole(units)
        now = bracket(known, limit)
        if now == (lo, hi):
            return lo, hi
        for units in [u for u in known if u not in exact and known[u] != UNBUILDABLE]:
            del known[units]
        a, b = sorted(exact)[-2:] if len(exact) >= 2 else (0, 0)
        guess = _line(known, a, b, limit, cap) if a else None
        if guess is not None:
            whole(guess)
            if guess < cap:
                whole(guess + 1)
        lo, hi = _narrow(whole, known, limit, *bracket(known, limit), cap)


def _narrow(
    peak: Any, known: dict[int, int], limit: int, lo: int, hi: int | None, cap: int
) -> tuple[int, int | None]:
    """Narrows ``(lo, hi)`` to neighbours: doubling while nothing is known not to fit, then
    secant and bisection steps in turn (the secant step converges in one or two compiles on a
    near-affine peak; the bisection step bounds the count when it is not)."""
    if lo == 0:
        # Only batches that do not fit are known: walk down to 1.
        while hi is not None and hi > 1 and lo == 0:
            mid = max(1, hi // 2)
            if peak(mid) <= limit:
                lo = mid
            else:
                hi = mid
        if lo == 0:
            return 0, hi
    while hi is None:
        nxt = min(lo * 2, cap)
        if nxt == lo:
            return lo, None
        if peak(nxt) <= limit:
            lo = nxt
        else:
            hi = nxt
    secant = True
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if secant and known[hi] != UNBUILDABLE:
            slope = (known[hi] - known[lo]) / (hi - lo)
            if slope > 0:
                mid = min(hi - 1, max(lo + 1, lo + int((limit - known[lo]) // slope)))
        secant = not secant
        if peak(mid) <= limit:
            lo = mid
        else:
            hi = mid
    return lo, hi


def _no_fit(
    workload: Workload, pol: Policy, sch: Schedule, step: int, limit: int, before: int, t0: float
) -> BatchFit:
    r = workload.compiled(pol, sch, step)
    return BatchFit(
        policy=pol.spec,
        schedule=sch.spec,
        max_batch=0,
        peak_bytes=r.peak_bytes,
        next_peak_bytes=r.peak_bytes,
        limit_bytes=limit,
        recompute_overhead=None,
        tokens_per_step=0,
        compiles=workload.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=r.xla_remat,
        note=Note(
            "batch_none_fits",
            {
                "policy": pol.spec,
                "batch": step,
                "peak_bytes": r.peak_bytes,
                "limit_bytes": limit,
                "target": workload.target.name,
            },
        ),
    )


def max_batch_plan(
    workload: Workload,
    *,
    headroom: float = DEFAULT_HEADROOM,
    start: int | None = None,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
) -> tuple[BatchFit, Plan | None]:
    """The largest batch any plan reaches, and the cheapest plan at that batch.

    The batch is :func:`max_batch` of ``full`` (the planner's end point: everything
    recomputed); the plan at that batch then keeps what the memory left allows.

    Args:
      workload: the step.
      headroom: fraction of device memory left free.
      start: first batch probed.
      offload, hide, extra: as for :func:`plan`.

    Returns:
      ``(fit, plan)``: the BatchFit of the plan (its policy, peak and overhead), and the Plan,
      or None when even the smallest batch does not fit.

    Example (not run as a doctest: it searches up to the whole device, thousands of
    sequences even for a tiny model)::

      fit, p = rk.search.max_batch_plan(w)
      model = factory(p.policy)  # trains ``fit.max_batch`` sequences per step
    """
    t0 = time.perf_counter()
    before = workload.compiles
    full = max_batch(workload, FULL, headroom=headroom, start=start)
    if not full.fits:
        return full, None
    return plan_at(
        full,
        workload,
        full.max_batch,
        limit_bytes=None,
        headroom=headroom,
        offload=offload,
        hide=hide,
        extra=extra,
        compiles=lambda: workload.compiles - before,
        t0=t0,
        note=lambda n: Note("plan_at_max_batch", {"max_batch": full.max_batch, "plan": n}),
    )
