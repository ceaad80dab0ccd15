"""The longest sequence: for one policy (:func:`max_seq`) or for any plan (:func:`max_seq_plan`).

The sequence changes the traced program (every activation's shape, the attention kernel's),
so the search takes a builder ``seq -> Workload`` rather than one workload: one workload per
sequence probed, each compiled at a fixed batch.

Example:
  >>> def at(seq):
  ...     return rk.sources.workload(tiny_model, "h100", rk.TrainConfig(1, seq, optimizer="sgd"))
  >>> fit = rk.search.max_seq(at, "full", granularity=64, limit_bytes=2**20)
  >>> fit.max_seq % 64, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes
  (0, True)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from jax.errors import JaxRuntimeError

from remat_kit.errors import BadType, BadValue
from remat_kit.notes import Note
from remat_kit.policies import PolicyLike, as_policy
from remat_kit.schedules import parse_schedule
from remat_kit.search._boundary import UNBUILDABLE, bracket, plan_at
from remat_kit.search._budget import DEFAULT_HEADROOM, limit_for
from remat_kit.search._fit import NotedFit
from remat_kit.search._planner import Plan
from remat_kit.search._workload import DEFAULT_HIDE, FULL, Workload

__all__ = [
    "DEFAULT_GRANULARITY",
    "DEFAULT_SEQ_CAP",
    "SeqFit",
    "max_seq",
    "max_seq_plan",
    "seq_multiple",
]

#: Tokens between two sequences the search tells apart (``--seq-step``).
DEFAULT_GRANULARITY = 1024

#: The longest sequence searched (1M tokens) where the caller gives no cap.
DEFAULT_SEQ_CAP = 1 << 20

#: Model-guided probes (a line or a quadratic through the compiled peaks) before the search
#: falls back to bisection, which at least halves the bracket every second compile.
MODEL_STEPS = 6

#: Three peaks whose parabola bends by less than this share of their rise read as a line.
CURVED = 0.01


#: A builder: the step at a sequence length, as a Workload (its ``seq`` that length).
Builder = Callable[[int], Workload]


@dataclasses.dataclass(frozen=True)
class SeqFit(NotedFit):
    """The longest sequence that fits at a fixed batch, for one policy and schedule.

    Attributes:
      policy, schedule: what was measured (specs).
      max_seq: the longest sequence (a multiple of ``granularity``) whose compiled peak is
        within ``limit_bytes`` (0: even ``granularity`` tokens do not fit).
      batch: sequences per step, the same at every probe.
      granularity: the step between the sequences searched (tokens).
      peak_bytes: compiled peak at ``max_seq`` (at ``granularity`` when it is 0).
      next_peak_bytes: compiled peak at ``max_seq + granularity`` (the proof it does not fit),
        or None when the search stopped at ``cap`` or that sequence could not be built (XLA
        or the model refused it; the message then says why).
      limit_bytes: device memory minus headroom, or the limit given.
      recompute_overhead: extra FLOPs of recomputation at ``max_seq`` (None when nothing fits).
      tokens_per_step: ``batch x max_seq``.
      compiles: programs compiled for this search (cached ones not counted).
      seconds: wall time of the search.
      xla_remat: XLA's own rematerialization pass changed the program at ``max_seq``.
      note: what the search found, as data (kind ``seq_fits``, ``seq_none_fits`` or
        ``plan_at_max_seq``); ``message`` is its words.
      predicted_seq: where the last line or quadratic through the compiled peaks put the
        boundary (None: no model was fitted, e.g. the smallest sequence did not fit).
      method: how the boundary was found: ``line`` or ``quadratic`` (the curve through the
        compiled peaks predicted it and two compiles verified it), ``bisection`` (the
        predictions missed; the bracket was halved), ``first probes`` (the two first
        compiles are the boundary), ``cap`` (the search stopped at ``cap``), or ``""`` when
        even the shortest sequence does not fit.
      attention: the attention kernel of the compiled step at ``max_seq`` (``xla``: einsum,
        its scores held; ``cudnn``: flash), as the report says; None where it does not.
    """

    policy: str
    schedule: str
    max_seq: int
    batch: int
    granularity: int
    peak_bytes: int
    next_peak_bytes: int | None
    limit_bytes: int
    recompute_overhead: float | None
    tokens_per_step: int
    compiles: int
    seconds: float
    xla_remat: bool = False
    note: Note | None = None
    predicted_seq: int | None = None
    method: str = ""
    attention: str | None = None

    @property
    def fits(self) -> bool:
        """At least the shortest sequence (``granularity`` tokens) fits."""
        return self.max_seq > 0


class _Probes:
    """The workloads a search built, by sequence, and the compiles it caused in them."""

    def __init__(self, build: Builder) -> None:
        self._build = build
        self._built: dict[int, Workload] = {}
        self._before: dict[int, int] = {}  # id(workload) -> its compiles when first seen

    def __call__(self, seq: int) -> Workload:
        if seq not in self._built:
            w = self._build(seq)
            # A broken builder is a TypeError: the search reads a ValueError of the builder's
            # as its refusal of a sequence, an upper bound.
            if not isinstance(w, Workload):
                raise BadType(
                    f"build({seq}) returned {type(w).__name__}, not an rk.Workload", param="build"
                )
            if w.seq != seq:
                raise BadType(
                    f"build({seq}) returned a workload of seq={w.seq}: the builder must build "
                    "the step at the sequence it is given",
                    param="build",
                )
            self._built[seq] = w
            self._before.setdefault(id(w), w.compiles)
        return self._built[seq]

    @property
    def compiles(self) -> int:
        seen = {id(w): w for w in self._built.values()}
        return sum(w.compiles - self._before[k] for k, w in seen.items())


def _probes(build: Builder | _Probes) -> _Probes:
    return build if isinstance(build, _Probes) else _Probes(build)


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(f"{name} must be an int, got {value!r}", param=name)
    if value < minimum:
        raise BadValue(f"{name}={value} must be at least {minimum}", param=name)
    return value


def max_seq(
    build: Builder,
    policy: PolicyLike = "full",
    schedule: Any = "none",
    *,
    batch: int = 1,
    granularity: int = DEFAULT_GRANULARITY,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = DEFAULT_SEQ_CAP,
) -> SeqFit:
    """The longest sequence (a multiple of ``granularity``) whose compiled peak fits.

    The peak is close to affine in the sequence where attention never holds the scores
    (flash attention: cuDNN's kernel) and quadratic where it does (einsum attention holds
    ``batch x heads x seq x seq`` scores), so the search fits that curve and verifies it.
    In units of ``granularity`` tokens:

    1. ``start`` (default 1) is compiled, then twice that, unless the first does not fit;
    2. a curve through the compiled peaks predicts the longest sequence under the limit: a
       quadratic through the bracket's ends (the longest known to fit, the shortest known
       not to) and the peak nearest them when the three are convex, else a line;
    3. the predicted ``s`` is compiled, and the curve fitted again with it; when it predicts
       ``s`` again, ``s + granularity`` is compiled: ``s`` fitting and ``s + granularity``
       not is the answer (four compiles in all on a line, five on a quadratic whose first
       line overshot);
    4. when that verification fails, after ``MODEL_STEPS`` predictions, or after two that
       did not halve the bracket, the search gallops from the last prediction (2, 4, 8 ...
       steps) until the boundary is bracketed, then bisects (:func:`_search`). A sequence
       that could not be built (below) is followed by one bisection step: no curve
       predicts it.

    Every probe is a compiled report for the workload's target, cached in its workload. A
    sequence XLA refuses to build (``JaxRuntimeError``: a kernel grid or an index past what
    the GPU or int32 allows) or the builder refuses (``BadValue``: past a model's learned
    positions, a length the mesh cannot split) counts as one that does not fit; refusing
    the shortest is an error. The refused lengths must be the long ones: a builder must not
    refuse a sequence and accept a longer one (choose a ``granularity`` the mesh divides).

    Args:
      build: ``seq -> Workload``: the step at that sequence (``workload.seq == seq``), e.g.
        ``lambda s: rk.sources.workload(model, target, dataclasses.replace(config, seq=s))``.
        Called once per sequence probed; a builder that returns the same Workload for a
        sequence in later searches (memoized) shares their compiles.
      policy: policy name/spec or Policy.
      schedule: layer schedule spec or Schedule.
      batch: sequences per step (a multiple of the workload's ``batch_multiple``).
      granularity: tokens between the sequences searched; every sequence probed is a multiple.
      headroom: fraction of the usable memory left free (see ``DEFAULT_HEADROOM``).
      limit_bytes: an explicit limit instead of the usable memory minus headroom.
      start: first sequence probed (rounded down to a multiple of ``granularity``).
      cap: the longest sequence searched; the search stops there.

    Returns:
      A SeqFit; ``max_seq == 0`` when even ``granularity`` tokens do not fit. ``compiles``
      counts the programs compiled for it, ``method`` says whether the prediction held.

    Raises:
      ValueError: a granularity, batch, start or cap below 1 (or a cap below the
        granularity), a batch that does not split into the workload's ``batch_multiple``, a
        target without a memory size and no ``limit_bytes``, a bad headroom; the builder's
        own error for the shortest sequence.
      TypeError: a builder that returns no Workload, or one of another sequence than asked;
        a size that is not an int.
      jax.errors.JaxRuntimeError: XLA cannot build even the shortest sequence.

    Example:
      >>> def at(seq):
      ...     config = rk.TrainConfig(batch=1, seq=seq, optimizer="sgd")
      ...     return rk.sources.workload(tiny_model, "h100", config)
      >>> fit = rk.search.max_seq(at, "full", granularity=64, limit_bytes=2**20)
      >>> fit.max_seq > 64, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes
      (True, True)
    """
    t0 = time.perf_counter()
    probes = _probes(build)
    before = probes.compiles
    g = _check_int("granularity", granularity)
    _check_int("batch", batch)
    _check_int("cap", cap)
    if start is not None:
        _check_int("start", start)
    if cap < g:
        raise BadValue(f"cap={cap} is below granularity={g}: nothing to search", param="cap")
    pol, sch = as_policy(policy), parse_schedule(schedule)
    units_cap = cap // g
    first = 1 if start is None else min(max(1, start // g), units_cap)
    w0 = probes(g)  # built, not compiled: its target and batch rules come before any compile
    if batch % w0.batch_multiple:
        raise BadValue(
            f"batch={batch} does not split into the step's {w0.batch_multiple} "
            "(gradient-accumulation steps x data-parallel GPUs); use a multiple of "
            f"{w0.batch_multiple}",
            param="batch",
        )
    limit = limit_for(w0.target, limit_bytes, headroom) if limit_bytes is None else limit_bytes
    known: dict[int, int] = {}  # units -> compiled peak
    refused: dict[int, str] = {}  # units -> why that sequence cannot be built

    def peak(units: int) -> int:
        if units not in known:
            try:
                known[units] = probes(units * g).compiled(pol, sch, batch).peak_bytes
            except (JaxRuntimeError, BadValue) as err:
                # A sequence XLA or the model cannot build does not run either: an upper
                # bound. The shortest failing is a real error.
                if units == 1:
                    raise
                known[units] = UNBUILDABLE
                who = "XLA" if isinstance(err, JaxRuntimeError) else "the model"
                refused[units] = f"{who}: {str(err).split(chr(10), 1)[0][:200]}"
        return known[units]

    peak(first)
    if known[first] <= limit and first < units_cap:
        peak(min(2 * first, units_cap))
    lo, hi, method, predicted = _search(peak, known, limit, units_cap)
    if lo == 0:
        r = probes(g).compiled(pol, sch, batch)
        return SeqFit(
            policy=pol.spec,
            schedule=sch.spec,
            max_seq=0,
            batch=batch,
            granularity=g,
            peak_bytes=r.peak_bytes,
            next_peak_bytes=r.peak_bytes,
            limit_bytes=limit,
            recompute_overhead=None,
            tokens_per_step=0,
            compiles=probes.compiles - before,
            seconds=time.perf_counter() - t0,
            xla_remat=r.xla_remat,
            note=Note(
                "seq_none_fits",
                {
                    "policy": pol.spec,
                    "batch": batch,
                    "seq": g,
                    "peak_bytes": r.peak_bytes,
                    "limit_bytes": limit,
                    "target": w0.target.name,
                },
            ),
            predicted_seq=None if predicted is None else predicted * g,
            method=method,
            attention=r.attention,
        )
    seq = lo * g
    w = probes(seq)
    best = w.compiled(pol, sch, batch)
    reason = refused.get(hi) if hi is not None else None
    nxt_peak = None if hi is None or reason is not None else known[hi]
    note = Note(
        "seq_fits",
        {
            "policy": pol.spec,
            "schedule": sch.spec,
            "batch": batch,
            "seq": seq,
            "peak_bytes": best.peak_bytes,
            "limit_bytes": limit,
            "next_seq": None if hi is None else hi * g,  # None: stopped at the cap
            "next_peak_bytes": nxt_peak,
            "refused": reason,
            "cap": cap,
        },
    )
    return SeqFit(
        policy=pol.spec,
        schedule=sch.spec,
        max_seq=seq,
        batch=batch,
        granularity=g,
        peak_bytes=best.peak_bytes,
        next_peak_bytes=nxt_peak,
        limit_bytes=limit,
        recompute_overhead=w.recompute_of(pol, sch, batch),
        tokens_per_step=batch * seq,
        compiles=probes.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=best.xla_remat,
        note=note,
        predicted_seq=None if predicted is None else predicted * g,
        method=method or "first probes",
        attention=best.attention,
    )


def _search(
    peak: Callable[[int], int], known: dict[int, int], limit: int, cap: int
) -> tuple[int, int | None, str, int | None]:
    """Narrows the compiled peaks ``known`` (units -> bytes) to neighbours ``lo`` (fits, 0:
    none does) and ``hi = lo + 1`` (does not; None: ``lo`` is the cap).

    First the curve through the peaks is followed (:func:`_predict`), up to ``MODEL_STEPS``
    predictions (after a sequence that could not be built, one bisection step). A prediction
    at a known end of the bracket is its own verification: the sequence next to that end is
    probed, and when it does not close the bracket the curve has missed there (XLA's choices
    bend it, or the peak is not monotone by a few bytes). Then the search gallops from that
    end (steps of 2, 4, 8 ... units) until it brackets the boundary, and bisects: about twice
    the log of the miss in compiles, not of the whole bracket. After ``MODEL_STEPS``
    predictions, or two that did not halve the bracket, it gallops the same way from the end
    the last one moved; without a curve it doubles from the longest known to fit until one
    does not, and bisects.

    Returns:
      ``(lo, hi, method, predicted)``: ``predicted`` the last model prediction (units).
    """
    method, predicted, toward, stride = "", None, None, 2
    steps, refused, u, before = 0, False, None, (0, None)

    def probe(units: int) -> int:
        # Every probe is strictly inside the bracket, so never a known one: a search that
        # asks again would loop for ever.
        if units in known:
            raise RuntimeError(f"max_seq: {units} units probed twice ({sorted(known)})")
        return peak(units)

    widths: list[float] = []  # the bracket's width before each prediction
    while True:
        lo, hi = bracket(known, limit)
        if _closed(lo, hi, cap):
            break
        widths.append(math.inf if hi is None else hi - lo)
        stalled = hi is not None and len(widths) > 2 and widths[-1] > widths[-3] / 2
        if u is not None and not refused and (steps >= MODEL_STEPS or stalled):
            # The predictions ran out, or the last two did not halve the bracket: the last
            # one is still the best guess there is; gallop from it, in steps of a quarter of
            # its move to start with.
            toward = "up" if known[u] <= limit else "down"
            moved = u - before[0] if toward == "up" else (before[1] or u) - u
            stride = max(2, moved // 4)
            break
        at_end = False
        if refused:
            # No curve predicts where XLA or the model starts refusing: bisect once.
            guess, method = (lo + hi) // 2 if hi is not None else 2 * lo, "bisection"
            widths.clear()
        else:
            pred, kind = _predict(known, limit, lo, hi)
            if pred is None:
                break
            steps += 1
            predicted, method = pred, method if method == "bisection" else kind
            guess = pred
            at_end = pred <= lo or (hi is not None and pred >= hi - 1)
        u, before = _inside(guess, lo, hi, cap), (lo, hi)
        probe(u)
        refused = known[u] >= UNBUILDABLE
        if at_end and not refused and not _closed(*bracket(known, limit), cap):
            toward = "up" if known[u] <= limit else "down"  # the curve missed on this side
            break
    while True:
        lo, hi = bracket(known, limit)
        if _closed(lo, hi, cap):
            break
        method = "bisection"
        if hi is None:
            guess = lo + stride if toward == "up" else max(1, 2 * lo)  # nothing over: grow
        elif toward == "up" and hi - lo > 2 * stride:
            guess = lo + stride
        elif toward == "down" and hi - lo > 2 * stride:
            guess = hi - stride
        else:
            guess, toward = (lo + hi) // 2, None
        stride *= 2
        probe(_inside(guess, lo, hi, cap))
    if hi is None:
        method = "cap"
    return lo, hi, method, predicted


def _closed(lo: int, hi: int | None, cap: int) -> bool:
    """Whether the bracket is neighbours, or the longest known to fit is the cap."""
    return (hi is not None and hi - lo == 1) or (hi is None and lo >= cap)


def _inside(guess: int, lo: int, hi: int | None, cap: int) -> int:
    """``guess`` moved strictly inside the bracket (and up to the cap): never a known unit."""
    return max(lo + 1, min(guess, cap if hi is None else hi - 1))


def _predict(known: dict[int, int], limit: int, lo: int, hi: int | None) -> tuple[int | None, str]:
    """Where a curve through the compiled peaks crosses ``limit`` (units, rounded down), and
    which curve; ``(None, "")`` with fewer than two peaks or a line that does not rise.

    The points are the bracket's ends (the longest known to fit, the shortest known not to)
    and the peaks nearest them in ratio, so the curve is local to the boundary: a ``quadratic``
    through three when they are convex (einsum attention's scores), else a ``line`` through
    two (flash attention, or where XLA's choices bend the curve).
    """
    finite = {u: p for u, p in known.items() if p < UNBUILDABLE}
    ends = [u for u in (lo, hi) if u in finite]
    rest = sorted(
        (u for u in finite if u not in ends),
        # Near on a log scale: 94 is nearer 168 than 1 is to 2 (a ratio, not a difference:
        # the peak's shape changes with the sequence's scale).
        key=lambda u: min(abs(math.log(u / e)) for e in ends) if ends else -u,
    )
    chosen = [(u, finite[u]) for u in [*ends, *rest][:3]]
    if len(chosen) == 3:
        root = _quadratic_root(chosen, limit)
        if root is not None:
            return max(0, math.floor(root)), "quadratic"
    if len(chosen) < 2:
        return None, ""
    (u1, p1), (u2, p2) = chosen[:2]
    slope = (p2 - p1) / (u2 - u1)
    if slope <= 0:
        return None, ""  # a peak that does not grow with the sequence: no line to follow
    return max(0, math.floor(u1 + (limit - p1) / slope)), "line"


def _quadratic_root(points: list[tuple[int, int]], limit: int) -> float | None:
    """The larger ``u`` where the parabola through three points reaches ``limit``; None when
    it is not convex (the peaks are then read as a line: see ``CURVED``) or never reaches it."""
    (x0, y0), (x1, y1), (x2, y2) = sorted(points)
    d01 = (y1 - y0) / (x1 - x0)
    d12 = (y2 - y1) / (x2 - x1)
    c = (d12 - d01) / (x2 - x0)
    if c * (x2 - x0) ** 2 <= CURVED * abs(y2 - y0):
        return None  # concave, or so nearly straight that the line says the same
    # y = y0 + d01 (x - x0) + c (x - x0)(x - x1) = c x^2 + b x + a
    b = d01 - c * (x0 + x1)
    a = y0 - d01 * x0 + c * x0 * x1 - limit
    disc = b * b - 4 * c * a
    if disc < 0:
        return None
    return (-b + math.sqrt(disc)) / (2 * c)


def max_seq_plan(
    build: Builder,
    *,
    batch: int = 1,
    granularity: int = DEFAULT_GRANULARITY,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = DEFAULT_SEQ_CAP,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
) -> tuple[SeqFit, Plan | None]:
    """The longest sequence any plan reaches, and the cheapest plan at that sequence.

    The sequence is :func:`max_seq` of ``full`` (the planner's end point: everything
    recomputed); the plan at that sequence then keeps what the memory left allows.

    Args:
      build: ``seq -> Workload``, as for :func:`max_seq` (its workloads need a
        ``residuals_fn``, as ``rk.sources.workload`` gives them).
      batch, granularity, headroom, limit_bytes, start, cap: as for :func:`max_seq`.
      offload, hide, extra: as for :func:`plan`.

    Returns:
      ``(fit, plan)``: the SeqFit of the plan (its policy, peak and overhead), and the Plan,
      or None when even the shortest sequence does not fit.

    Raises:
      ValueError, TypeError: as :func:`max_seq` and :func:`plan` raise them.

    Example:
      >>> def at(seq):
      ...     config = rk.TrainConfig(batch=1, seq=seq, optimizer="sgd")
      ...     return rk.sources.workload(tiny_model, "h100", config)
      >>> fit, p = rk.search.max_seq_plan(at, granularity=64, limit_bytes=2**20)
      >>> fit.max_seq > 64, p.fits, p.peak_bytes <= 2**20
      (True, True, True)
    """
    t0 = time.perf_counter()
    probes = _probes(build)
    before = probes.compiles
    full = max_seq(
        probes,
        FULL,
        batch=batch,
        granularity=granularity,
        headroom=headroom,
        limit_bytes=limit_bytes,
        start=start,
        cap=cap,
    )
    if not full.fits:
        return full, None
    return plan_at(
        full,
        probes(full.max_seq),
        batch,
        limit_bytes=limit_bytes,
        headroom=headroom,
        offload=offload,
        hide=hide,
        extra=extra,
        compiles=lambda: probes.compiles - before,
        t0=t0,
        note=lambda n: Note("plan_at_max_seq", {"max_seq": full.max_seq, "plan": n}),
    )


def seq_multiple(plan: Any) -> int:
    """What every sequence must be a multiple of for a mesh plan to split it.

    The plan's ``seq_ways`` (the product of the axes that split the sequence: ``cp``, and
    ``tp`` between blocks); for a plan without one, the product of the sizes of the mesh
    axes its rules map a sequence axis to (the logical names with ``seq`` in them).

    Args:
      plan: a ``rk.MeshPlan``, or None (one device).

    Returns:
      The multiple (1 without a plan, or when nothing splits the sequence).

    Example:
      >>> seq_multiple(rk.parse_shard("fsdp:4,tp:2")), seq_multiple(None)
      (2, 1)
    """
    if plan is None:
        return 1
    ways = getattr(plan, "seq_ways", None)
    if isinstance(ways, int):
        return ways
    axes: set[str] = set()
    for name, mesh_axes in plan.rules():
        if "seq" not in name or mesh_axes is None:
            continue
        axes.update([mesh_axes] if isinstance(mesh_axes, str) else mesh_axes)
    return math.prod(plan.size(a) for a in axes)
