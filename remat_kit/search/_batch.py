"""The largest batch: for one policy (:func:`max_batch`) or for any plan (:func:`max_batch_plan`).

Example:
  >>> fit = rk.max_batch(w, "full", limit_bytes=2**20)
  >>> fit.batch > 2, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes
  (True, True)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from jax.errors import JaxRuntimeError

from remat_kit._workers import ClusterError
from remat_kit.notes import Note
from remat_kit.policies import FULL, Policy, PolicyLike, as_policy
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.search._boundary import CURVES, UNBUILDABLE, Fit, Peaks, bracket, plan_at, search
from remat_kit.search._budget import DEFAULT_HEADROOM, limit_for
from remat_kit.search._planner import Plan
from remat_kit.sources._workload import DEFAULT_HIDE, FIXED_PARTS, Workload

#: How far (a fraction) the first peak read off shallow copies may be from the full step's
#: for the search to go on with copies. Measured on a 2048-wide Llama, 32 layers, under
#: ``full``: 0.03% at batch 1, but at batch 4 and 17 the copies' lines were 2.3x over.
COPIES_TOLERANCE = 0.02

#: The largest batch searched (16,384 sequences) where the caller gives no cap.
DEFAULT_BATCH_CAP = 1 << 14

__all__ = [
    "DEFAULT_BATCH_CAP",
    "max_batch",
    "max_batch_plan",
]


def max_batch(
    workload: Workload,
    policy: PolicyLike = "full",
    schedule: Any = "none",
    *,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = DEFAULT_BATCH_CAP,
) -> Fit:
    """The largest batch whose compiled peak fits the device minus ``headroom``.

    Peak memory is close to affine in the batch for a fixed policy and schedule (activations
    grow with it, the rest is constant), so the search fits a line and verifies it:

    1. two compiles give a line. The first is at ``start``; without one, where the inputs
       (shapes) plus the residuals the step saves per sample (a trace) reach the limit, which
       is at or just past the boundary. The second is where that compile puts the boundary:
       on the line from the inputs through it when it does not fit (a large batch peaks at
       the end of the forward pass), else from the activations per sample it shows besides
       the fixed parts (without shapes, ``Workload.shapes_known``: twice ``start``, or half);
    2. the line predicts the largest batch ``b`` under the limit;
    3. ``b`` and ``b + 1`` are compiled: when ``b`` fits and ``b + 1`` does not, that is the
       answer (four compiles in all);
    4. otherwise the boundary search (:func:`~remat_kit.search._boundary.search`) follows
       the line through the peaks nearest the bracket's ends, then gallops and bisects.

    Every probe is a compiled report for the workload's target, cached in the workload; the
    answer always rests on two compiled peaks, ``b`` fitting and ``b + 1`` not (or ``cap``).
    Where a probe's peak was read off shallow copies of an unrolled model
    (``Workload.estimates``), those two are compiled whole, and the search goes on where
    that moves the boundary.

    Args:
      workload: the step to compile.
      policy: policy name/spec or Policy.
      schedule: layer schedule spec or Schedule.
      headroom: fraction of device memory left free (see ``DEFAULT_HEADROOM``).
      limit_bytes: an explicit limit instead of device memory minus headroom.
      start: first batch probed (rounded to ``workload.batch_multiple``); default the traced
        estimate above, or the multiple without residuals.
      cap: stop searching above this batch (default :data:`DEFAULT_BATCH_CAP`, 16,384).

    Returns:
      A :class:`~remat_kit.search.Fit` along ``batch``; its ``batch`` is 0 when even the
      smallest batch does not fit. ``compiles`` counts the programs compiled for it,
      ``method`` says whether the line held.

    Raises:
      ValueError: a target without a memory size and no ``limit_bytes``; a bad headroom.

    Example:
      >>> fit = rk.max_batch(w, "full", limit_bytes=2**20)  # 1 MiB for this tiny step
      >>> fit.batch > 1, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes, fit.method
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
    probes = _Batches(workload, pol, sch, step)
    peak, known = probes.peak, probes.peak.known
    first = _first_probe(workload, pol, sch, step, limit, start, units_cap)
    second = _second_probe(workload, peak(first), first, step, limit, units_cap)
    if second != first and second < units_cap:
        # The second probe is where a line puts the boundary; its other side goes beside it.
        probes.pair(second, second + 1)
    peak(second)
    if min(first, second) == 1 and peak(1) > limit and probes.whole(1) > limit:
        return _no_fit(workload, pol, sch, step, limit, before, t0)
    predicted, method = _follow_lines(workload, probes, first, second, step, limit, units_cap)
    lo, hi = bracket(known, limit)
    if method == "bisection":
        lo, hi, _, _ = search(peak, known, limit, units_cap, CURVES["batch"], peak.xla)
        if hi is None:
            method = "cap"
    verified = _verify_boundary(probes, limit, lo, hi, units_cap)
    if verified != (lo, hi):
        method, (lo, hi) = "bisection", verified
    if lo == 0:
        return _no_fit(workload, pol, sch, step, limit, before, t0)
    best = workload.compiled(pol, sch, lo * step)
    batch = lo * step
    refusal = peak.refused.get(hi) if hi is not None else None
    nxt_peak = known.get(hi) if hi is not None and refusal is None else None
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
            "unbuildable": None if refusal is None else refusal[1],  # XLA's refusal
            "cap": cap,
        },
    )
    return Fit(
        "batch",
        policy=pol.spec,
        schedule=sch.spec,
        batch=batch,
        seq=workload.seq,
        unit=step,
        peak_bytes=best.peak_bytes,
        next_peak_bytes=nxt_peak,
        limit_bytes=limit,
        recompute_overhead=workload.recompute_of(pol, sch, batch),
        compiles=workload.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=best.xla_remat,
        xla_remat_bytes=best.xla_remat_saved_bytes,
        note=note,
        predicted=None if predicted is None else predicted * step,
        method=method,
        attention=best.attention,
    )


class _Batches:
    """The compiled peaks of one workload's step by units of its batch multiple.

    ``peak`` compiles a point as the workload does (off shallow copies of an unrolled
    model where it ``estimates``); ``whole`` compiles it whole, as an answer must
    rest on. The first figure from copies is checked against the whole step: where the
    copies are far off (XLA orders a shallow step differently at this batch), a search on
    them would go astray, and every later probe is compiled whole instead.

    A batch XLA cannot build (a kernel grid or an index past what the GPU or int32 allows)
    does not run either: ``peak`` keeps it as an upper bound (:class:`Peaks`).
    """

    def __init__(self, workload: Workload, pol: Policy, sch: Schedule, step: int) -> None:
        self.workload, self.pol, self.sch, self.step = workload, pol, sch, step
        self.exact: set[int] = set()  # units whose peak is the full step's (not copies')
        self.copies: list[bool] = []  # [held]: whether the copies' peak held where checked
        self.peak = Peaks(self._measure, (JaxRuntimeError,))
        self.slowest = 0.0  # seconds of the slowest compile here so far
        # Every probe is the full step's compile: no copies to read (a scanned model, or
        # --depth full), or the copies were off and every later probe is compiled whole.
        self.full_probes = not workload.estimates

    def pair(self, a: int, b: int) -> None:
        """Compiles units ``a`` and ``b`` side by side, where they are still to be compiled
        as the full step (the boundary's two sides) and the workload's :attr:`spread` has
        workers, and a compile here took longer than a worker takes to start: one here, the
        other in a worker at the same time. Their peaks are then read as usual (cached)."""
        w, known = self.workload, self.peak.known
        spread = w.spread
        if spread is None or not spread.side_by_side or self.slowest < spread.slow_seconds:
            return
        whole = w.estimates
        if not self.full_probes and not all(u in known for u in (a, b)):
            return  # these probes are read off shallow copies: cheap, one by one
        todo = [u for u in (a, b) if u and u not in self.exact and known.get(u) != UNBUILDABLE]
        keys = [(self.pol, self.sch, u * self.step) for u in todo]
        if len(keys) < 2 or all(w.has(*k, whole=whole) for k in keys):
            return
        try:
            with self._timed():
                w.compile_all(keys, whole=whole, at_once=True)
        except (JaxRuntimeError, ClusterError, BrokenProcessPool):
            return  # a refusal or a lost worker: the probes run here, one by one, as before

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        """Times a call that may compile; a compile's time raises :attr:`slowest`."""
        before, t0 = self.workload.compiles, time.perf_counter()
        yield
        if self.workload.compiles > before:
            self.slowest = max(self.slowest, time.perf_counter() - t0)

    def whole(self, units: int) -> int:
        """The full step's peak at ``units`` (compiled whole once; where the workload's probes
        are not estimates, every peak is)."""
        w, known = self.workload, self.peak.known
        if not w.estimates:
            self.exact.add(units)
            return self.peak(units)
        if units not in self.exact and known.get(units) != UNBUILDABLE:
            b = units * self.step
            with self._timed():
                if self.copies == [False]:
                    r = w.whole(self.pol, self.sch, b)
                else:
                    r = w.verified(self.pol, self.sch, b)
            known[units] = r.peak_bytes
            self._xla(units, r)
            self.exact.add(units)
        return known[units]

    def _xla(self, units: int, r: Any) -> None:
        """Where XLA's own remat pass acted on the report ``r`` of ``units``: what it took
        off and whether it fell short of its goal (its log line gives the goal then)."""
        if r.xla_remat:
            self.peak.xla[units] = (r.xla_remat_saved_bytes, r.xla_remat_limit_bytes is not None)
        else:
            self.peak.xla.pop(units, None)

    def _measure(self, units: int) -> int:
        if self.copies == [False]:
            return self.whole(units)
        w, b = self.workload, units * self.step
        with self._timed():
            r = w.compiled(self.pol, self.sch, b)
        self.peak.known[units] = r.peak_bytes
        self._xla(units, r)
        if not self.copies and w.estimates:
            with self._timed():  # the first full-depth compile: how slow they are
                full = w.verified(self.pol, self.sch, b)
            if full is not r:
                held = abs(r.peak_bytes / self.whole(units) - 1) <= COPIES_TOLERANCE
                self.copies.append(held)
                self.full_probes = not held
            else:  # the step was compiled whole (not read off copies): so is every probe
                self.full_probes = True
        return self.peak.known[units]


def _follow_lines(
    workload: Workload,
    probes: _Batches,
    first: int,
    second: int,
    step: int,
    limit: int,
    cap: int,
) -> tuple[int | None, str]:
    """The line through the first two peaks, followed: ``(predicted, method)``.

    ``predicted`` is where the line puts the boundary (units; None: the peak does not grow
    with the batch); ``method`` is ``line`` (or ``cap``) where the batch it predicts fits
    and the next does not, ``two lines`` where it missed and the line from the inputs
    through the smallest batch known not to fit held, else ``bisection``.
    """
    peak = probes.peak
    known = peak.known
    predicted = _line(known, first, second, limit, cap)
    if predicted is None:
        return None, "bisection"
    b = max(1, min(predicted, cap))
    if b < cap:
        probes.pair(b, b + 1)  # the line is right more often than not: both sides at once
    if peak(b) <= limit and (b == cap or peak(b + 1) > limit):
        return predicted, "line" if b < cap else "cap"
    # The line missed: the peak is convex in the batch. Past a point the step peaks before
    # any gradient exists (end of the forward pass, the loss), on a steeper line through
    # what no batch changes; follow that one from the smallest batch known not to fit.
    lo, hi = bracket(known, limit)
    guess = None if hi is None else _forward_line(workload, known, hi, step, limit)
    inside = guess is not None and hi is not None and lo < guess < hi
    if inside and peak(guess) <= limit and peak(guess + 1) > limit:
        return predicted, "two lines"
    return predicted, "bisection"


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
    if not workload.shapes_known or not workload.plannable:
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
    workload's shapes, no compile), so that the line is accurate there and the
    second point is often one of the two batches that verify it:

    - ``first`` fits: activations per sample are about ``(peak - fixed) / batch``, with every
      gradient among the fixed parts (small batches peak in the backward pass);
    - ``first`` does not fit: on the line from the inputs through it (large batches peak at
      the end of the forward pass, before any gradient exists).

    Otherwise twice (or, when ``first`` does not fit, half) the first batch.
    """
    fits = first_peak <= limit
    fallback = min(first * 2, cap) if fits else max(1, first // 2)
    if not workload.shapes_known or first_peak >= UNBUILDABLE:
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
    if not workload.shapes_known:
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
    probes: _Batches, limit: int, lo: int, hi: int | None, cap: int
) -> tuple[int, int | None]:
    """``(lo, hi)`` resting on peaks of the full step (``probes.whole``) where some were read
    off shallow copies of an unrolled model (``Workload.estimates``): both sides are
    compiled whole. Where that moves the boundary the copies were off here: their peaks are
    dropped, and the search goes on from the line through the last two whole peaks, then
    by the boundary search, compiling whole."""
    known, exact, whole = probes.peak.known, probes.exact, probes.whole
    while True:
        probes.pair(lo, hi or 0)
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
        lo, hi, _, _ = search(whole, known, limit, cap, CURVES["batch"])


def _no_fit(
    workload: Workload, pol: Policy, sch: Schedule, step: int, limit: int, before: int, t0: float
) -> Fit:
    r = workload.compiled(pol, sch, step)
    return Fit(
        "batch",
        policy=pol.spec,
        schedule=sch.spec,
        batch=0,
        seq=workload.seq,
        unit=step,
        peak_bytes=r.peak_bytes,
        next_peak_bytes=r.peak_bytes,
        limit_bytes=limit,
        recompute_overhead=None,
        compiles=workload.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=r.xla_remat,
        xla_remat_bytes=r.xla_remat_saved_bytes,
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
        attention=r.attention,
    )


def max_batch_plan(
    workload: Workload,
    *,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = DEFAULT_BATCH_CAP,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
) -> tuple[Fit, Plan | None]:
    """The largest batch any plan reaches, and the cheapest plan at that batch.

    The batch is :func:`max_batch` of ``full`` (the planner's end point: everything
    recomputed); the plan at that batch then keeps what the memory left allows.

    Args:
      workload: the step.
      headroom: fraction of device memory left free.
      limit_bytes: an explicit limit instead of device memory minus headroom.
      start: first batch probed.
      cap: stop searching above this batch (default :data:`DEFAULT_BATCH_CAP`, 16,384).
      offload, hide, extra: as for :func:`plan`.

    Returns:
      ``(fit, plan)``: the Fit of the plan (its policy, peak and overhead), and the Plan,
      or None when even the smallest batch does not fit.

    Example (not run as a doctest: it searches up to the whole device, thousands of
    sequences even for a tiny model)::

      fit, p = rk.search.max_batch_plan(w)
      model = factory(p.policy)  # trains ``fit.batch`` sequences per step
    """
    t0 = time.perf_counter()
    before = workload.compiles
    full = max_batch(
        workload, FULL, headroom=headroom, limit_bytes=limit_bytes, start=start, cap=cap
    )
    if not full.fits:
        return full, None
    return plan_at(
        full,
        workload,
        limit_bytes=limit_bytes,
        headroom=headroom,
        offload=offload,
        hide=hide,
        extra=extra,
        compiles=lambda: workload.compiles - before,
        t0=t0,
    )
