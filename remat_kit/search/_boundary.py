"""The one boundary search: the largest value along an axis (batch or sequence) that fits.

:func:`~remat_kit.search._batch.max_batch` walks the batch, whose peak is near a line in it;
:func:`~remat_kit.search._seq.max_seq` the sequence, a line under flash attention and a parabola
where the scores are held. Each opens with its own first probes (what shapes and traces say
about its axis, no compile), then both hand the compiled peaks to :func:`search`, which
follows the axis's curve (:data:`CURVES`) to the boundary and falls back to galloping and
bisection where the curve misses; both answer a :class:`Fit` and end, for a plan, in
:func:`plan_at`: the cheapest plan at the boundary ``full`` reaches.

Every point is a unit of the axis (a multiple of the workload's ``batch_multiple``, or of the
sequence's granularity); every peak a compiled one (:class:`Peaks`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from remat_kit.notes import Note, words
from remat_kit.search._planner import Plan, plan
from remat_kit.search._xla_fit import xla_made_fit
from remat_kit.sources._workload import Workload

__all__ = [
    "AXES",
    "CURVES",
    "Fit",
    "Peaks",
    "bracket",
    "plan_at",
    "search",
]

#: The axes a boundary is searched along.
AXES = ("batch", "seq")

#: The curves :func:`search` may fit through the compiled peaks, by axis: the peak is near
#: affine in the batch (activations grow with it, the rest is constant), and affine or
#: quadratic in the sequence (einsum attention holds ``batch x heads x seq x seq`` scores).
CURVES: dict[str, tuple[str, ...]] = {"batch": ("line",), "seq": ("line", "quadratic")}

#: The "peak" of a point XLA or the model refused to build: over any limit (:func:`bracket`).
UNBUILDABLE = 1 << 62

#: Model-guided probes (a curve through the compiled peaks) before the search falls back to
#: bisection, which at least halves the bracket every second compile.
MODEL_STEPS = 6

#: Three peaks whose parabola bends by less than this share of their rise read as a line.
CURVED = 0.01


@dataclasses.dataclass(frozen=True)
class Fit:
    """The largest value along one axis that fits, for one policy and schedule.

    Attributes:
      axis: ``"batch"`` (:func:`~remat_kit.search.max_batch`) or ``"seq"``
        (:func:`~remat_kit.search.max_seq`).
      policy, schedule: what was measured (specs).
      batch: sequences per step: along ``batch`` the largest that fits (0: even the smallest
        does not), along ``seq`` the fixed batch of every probe.
      seq: tokens per sequence: along ``seq`` the longest that fits (0: even ``unit`` tokens
        do not), along ``batch`` the workload's.
      unit: the step between the values searched (the workload's ``batch_multiple``, or the
        sequence's granularity in tokens); every value probed is a multiple.
      peak_bytes: compiled peak at the boundary (at the smallest value when nothing fits).
      next_peak_bytes: compiled peak one unit further (the proof it does not fit), or None
        when the search stopped at its cap or that value could not be built (the message
        then says why).
      limit_bytes: device memory minus headroom, or the limit given.
      recompute_overhead: extra FLOPs of recomputation at the boundary (None: nothing fits).
      compiles: programs compiled for this search (cached ones not counted).
      seconds: wall time of the search.
      xla_remat: XLA's own rematerialization pass changed the program at the boundary.
      note: what the search found, as data (kinds ``batch_fits``, ``batch_none_fits``,
        ``plan_at_max_batch``, ``seq_fits``, ``seq_none_fits``, ``plan_at_max_seq``);
        ``message`` is its words.
      predicted: where the last curve through the compiled peaks put the boundary (None: no
        curve was fitted, e.g. the peak does not grow along the axis).
      method: how the boundary was found: ``line`` or ``quadratic`` (the curve predicted it
        and compiles verified it), ``two lines`` (along the batch: the line overshot, as it
        does where the peak moves to the end of the forward pass; a second line from the
        inputs through the failed point held), ``bisection`` (the predictions missed),
        ``first probes`` (the first two compiles are the boundary), ``cap`` (the search
        stopped at its cap), or ``""`` when nothing fits.
      attention: the attention kernel of the compiled step at the boundary (``xla``: einsum,
        its scores held; ``cudnn``: flash), as its report says; None where it does not.
      xla_remat_bytes: what XLA's own rematerialization pass took off the peak at the
        boundary (``MemoryReport.xla_remat_saved_bytes``; 0: nothing). Where the answer fits
        only thanks to it, :attr:`caveats` says so.

    Example:
      >>> f = Fit("batch", "full", "none", batch=8, seq=512, unit=1, peak_bytes=9,
      ...         next_peak_bytes=11, limit_bytes=10, recompute_overhead=0.2, compiles=3,
      ...         seconds=0.1)
      >>> f.value, f.fits, f.tokens_per_step, f.xla_remat, f.xla_remat_bytes  # no XLA remat
      (8, True, 4096, False, 0)
    """

    axis: Literal["batch", "seq"]
    policy: str
    schedule: str
    batch: int
    seq: int
    unit: int
    peak_bytes: int
    next_peak_bytes: int | None
    limit_bytes: int
    recompute_overhead: float | None
    compiles: int
    seconds: float
    xla_remat: bool = False
    note: Note | None = None
    predicted: int | None = None
    method: str = ""
    attention: str | None = None
    xla_remat_bytes: int = 0

    @property
    def value(self) -> int:
        """The boundary along the axis: the largest batch, or the longest sequence."""
        return self.batch if self.axis == "batch" else self.seq

    @property
    def fits(self) -> bool:
        """At least the smallest value along the axis fits."""
        return self.value > 0

    @property
    def tokens_per_step(self) -> int:
        """``batch x seq`` at the boundary (0 when nothing fits)."""
        return self.batch * self.seq

    @property
    def message(self) -> str:
        """The note in words, one line (``""`` without a note)."""
        return "" if self.note is None else words(self.note)

    @property
    def caveats(self) -> tuple[Note, ...]:
        """What a user should read beside the answer: a ``xla_remat_made_fit`` note where
        it fits only because XLA's own remat pass took :attr:`xla_remat_bytes` off its peak
        (without that pass the peak is over :attr:`limit_bytes`).

        Example:
          >>> f = Fit("batch", "none", "none", batch=297, seq=2048, unit=1, peak_bytes=9,
          ...         next_peak_bytes=11, limit_bytes=10, recompute_overhead=0.0, compiles=3,
          ...         seconds=0.1, xla_remat=True, xla_remat_bytes=2**25)
          >>> [(n.kind, n.data["policy"], n.data["value"]) for n in f.caveats]
          [('xla_remat_made_fit', 'none', 297)]
        """
        note = xla_made_fit(
            self.policy,
            self.schedule,
            self.axis,
            self.value,
            peak_bytes=self.peak_bytes,
            saved_bytes=self.xla_remat_bytes if self.xla_remat else 0,
            limit_bytes=self.limit_bytes,
        )
        return () if note is None else (note,)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, the note as ``Note.to_dict()``, plus ``value``,
        ``tokens_per_step``, ``fits``, ``message`` and ``caveats`` (each
        ``Note.to_dict()`` with its words as ``text``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["note"] = None if self.note is None else self.note.to_dict()
        derived = {"value": self.value, "tokens_per_step": self.tokens_per_step}
        caveats = [{**n.to_dict(), "text": words(n)} for n in self.caveats]
        return {**out, **derived, "fits": self.fits, "message": self.message, "caveats": caveats}


class Peaks:
    """The compiled peaks a search has, by unit of its axis, and the units it could not build.

    Calling it with a unit compiles that point once (``measure``) and remembers its peak. A
    point ``measure`` refuses with one of ``refusals`` (XLA: a kernel grid or an index past
    what the GPU or int32 allows; the model: past its learned positions) does not run
    either: it is an upper bound, kept as :data:`UNBUILDABLE`, its refusal's first line in
    ``refused``. Refusing the smallest unit is a real error: it propagates.

    Where XLA's own rematerialization pass acted on a point, ``measure`` may say so in
    ``xla`` (units -> the bytes the pass took off, whether it fell short of its goal): the
    search then knows which peaks the pass held down (:func:`search`).

    Example:
      >>> def measure(units):
      ...     if units > 3:
      ...         raise OverflowError("too large\\nmore")
      ...     return 10 * units
      >>> peaks = Peaks(measure, (OverflowError,))
      >>> peaks(2), peaks(5) == UNBUILDABLE, peaks.refused[5][1]
      (20, True, 'too large')
    """

    def __init__(
        self, measure: Callable[[int], int], refusals: tuple[type[Exception], ...]
    ) -> None:
        self.known: dict[int, int] = {}  # units -> compiled peak
        self.refused: dict[int, tuple[type[Exception], str]] = {}  # units -> (kind, first line)
        self.xla: dict[int, tuple[int, bool]] = {}  # units -> (bytes XLA took off, fell short)
        self._measure = measure
        self._refusals = refusals

    def __call__(self, units: int) -> int:
        if units not in self.known:
            try:
                self.known[units] = self._measure(units)
            except self._refusals as err:
                if units == 1:
                    raise
                self.known[units] = UNBUILDABLE
                self.refused[units] = (type(err), str(err).split("\n", 1)[0][:200])
        return self.known[units]


def bracket(known: dict[int, int], limit: int) -> tuple[int, int | None]:
    """The largest unit known to fit (0: none) and the smallest larger one known not to
    (None: none), from compiled peaks by unit.

    Example:
      >>> bracket({1: 5, 2: 9, 4: 30, 3: 12}, limit=10)
      (2, 3)
    """
    # A point that could not be built never fits, whatever the limit: a caller's limit_bytes
    # is taken as given, and a budget on a target of no known memory (the CPU) is bounded
    # by no device.
    limit = min(limit, UNBUILDABLE - 1)
    lo = max((u for u, p in known.items() if p <= limit), default=0)
    hi = min((u for u in known if u > lo), default=None)  # above lo, none fits
    return lo, hi


def search(
    peak: Callable[[int], int],
    known: dict[int, int],
    limit: int,
    cap: int,
    curves: tuple[str, ...],
    xla: Mapping[int, tuple[int, bool]] | None = None,
) -> tuple[int, int | None, str, int | None]:
    """Narrows the compiled peaks ``known`` (units -> bytes) to neighbours ``lo`` (fits, 0:
    none does) and ``hi = lo + 1`` (does not; None: ``lo`` is the cap).

    First the curve through the peaks is followed (:func:`_predict`, among ``curves``), up to
    ``MODEL_STEPS`` predictions (after a point that could not be built, one bisection step). A
    prediction at a known end of the bracket is its own verification: the unit next to that
    end is probed, and when it does not close the bracket the curve has missed there (XLA's
    choices bend it, or the peak is not monotone by a few bytes). Then the search gallops from
    that end (steps of 2, 4, 8 ... units) until it brackets the boundary, and bisects: about
    twice the log of the miss in compiles, not of the whole bracket. After ``MODEL_STEPS``
    predictions, or two that did not halve the bracket, it gallops the same way from the end
    the last one moved (a prediction at an end of the bracket is still probed first: one
    unit, no more than the gallop's first step); without a curve that rises (the nearest
    peak's line, else the next nearest's: XLA's own remat pass can hold the peak on a
    plateau) it doubles from the largest known to fit until one does not, and bisects.

    Args:
      peak: ``units -> compiled peak`` (a :class:`Peaks`, or a function that fills ``known``).
      known: the peaks compiled so far; the search adds to it through ``peak``.
      limit: the bytes a point must fit in.
      cap: the largest unit searched.
      curves: the curves the axis allows (:data:`CURVES`).
      xla: where XLA's own remat pass acted, by unit: the bytes it took off the peak and
        whether it fell short of its goal (:attr:`Peaks.xla`); lines follow its plateau
        (:func:`_xla_line`).

    Returns:
      ``(lo, hi, method, predicted)``: ``predicted`` the last curve's prediction (units).

    Example:
      >>> known = {}
      >>> def peak(u):
      ...     known[u] = 100 + 7 * u
      ...     return known[u]
      >>> peak(1), peak(2)
      (107, 114)
      >>> search(peak, known, limit=400, cap=1000, curves=("line",))[:3]
      (42, 43, 'line')
    """
    method, predicted, toward, stride = "", None, None, 2
    steps, refused, u, before = 0, False, None, (0, None)

    def probe(units: int) -> int:
        # Every probe is strictly inside the bracket, so never a known one: a search that
        # asks again would loop for ever.
        if units in known:
            raise RuntimeError(f"boundary search: {units} units probed twice ({sorted(known)})")
        return peak(units)

    widths: list[float] = []  # the bracket's width before each prediction
    while True:
        lo, hi = bracket(known, limit)
        if _closed(lo, hi, cap):
            break
        widths.append(math.inf if hi is None else hi - lo)
        stalled = hi is not None and len(widths) > 2 and widths[-1] > widths[-3] / 2
        pred, kind = (None, "") if refused else _predict(known, limit, lo, hi, curves, xla)
        at_end = pred is not None and (pred <= lo or (hi is not None and pred >= hi - 1))
        if u is not None and not refused and (steps >= MODEL_STEPS or stalled) and not at_end:
            # The predictions ran out, or the last two did not halve the bracket: the last
            # one is still the best guess there is; gallop from it, in steps of a quarter of
            # its move to start with. A prediction at an end of the bracket is probed still:
            # the unit next to that end closes the bracket, or says on which side the curve
            # missed (then the gallop starts there), for no more than a gallop's first step.
            toward = "up" if known[u] <= limit else "down"
            moved = u - before[0] if toward == "up" else (before[1] or u) - u
            stride = max(2, moved // 4)
            break
        if refused:
            # No curve predicts where XLA or the model starts refusing: bisect once. The
            # refused unit is above lo and never fits (bracket): hi is known, at it or under.
            assert hi is not None
            guess, method = (lo + hi) // 2, "bisection"
            widths.clear()
        else:
            if pred is None:
                break
            steps += 1
            predicted, method = pred, method if method == "bisection" else kind
            guess = pred
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
    """Whether the bracket is neighbours, or the largest known to fit is the cap."""
    return (hi is not None and hi - lo == 1) or (hi is None and lo >= cap)


def _inside(guess: int, lo: int, hi: int | None, cap: int) -> int:
    """``guess`` moved strictly inside the bracket (and up to the cap): never a known unit."""
    return max(lo + 1, min(guess, cap if hi is None else hi - 1))


def _predict(
    known: dict[int, int],
    limit: int,
    lo: int,
    hi: int | None,
    curves: tuple[str, ...],
    xla: Mapping[int, tuple[int, bool]] | None = None,
) -> tuple[int | None, str]:
    """Where a curve through the compiled peaks crosses ``limit`` (units, rounded down), and
    which curve; ``(None, "")`` with fewer than two peaks or a line that does not rise.

    The points are the bracket's ends (the largest known to fit, the smallest known not to)
    and the peaks nearest them in ratio, so the curve is local to the boundary: a
    ``quadratic`` through three when ``curves`` allows one and they are convex (einsum
    attention's scores), else a ``line`` through two. Where an end of the bracket lies on
    XLA's plateau (``xla``: its own remat pass held that peak under its goal), the line is
    the one the peak follows where the pass falls short (:func:`_xla_line`).
    """
    finite = {u: p for u, p in known.items() if p < UNBUILDABLE}
    if xla and curves == ("line",):
        past = _xla_line(finite, xla, limit, lo, hi)
        if past is not None:
            return past, "line"
    ends = [u for u in (lo, hi) if u in finite]
    rest = sorted(
        (u for u in finite if u not in ends),
        # Near on a log scale: 94 is nearer 168 than 1 is to 2 (a ratio, not a difference:
        # the peak's shape changes with the axis's scale).
        key=lambda u: min(abs(math.log(u / e)) for e in ends) if ends else -u,
    )
    chosen = [(u, finite[u]) for u in [*ends, *rest][:3]]
    if len(chosen) == 3 and "quadratic" in curves:
        root = _quadratic_root(chosen, limit)
        if root is not None:
            return max(0, math.floor(root)), "quadratic"
    if len(chosen) < 2:
        return None, ""
    u1, p1 = chosen[0]
    # The other end of the bracket, else the nearest peak; where the line to it does not
    # rise (XLA's own remat pass holds the peak on a plateau under its goal for a stretch of
    # the axis), the next nearest that does: a line that rises, if shallow, still bounds the
    # boundary, where a doubling from the largest that fits overshoots it by that much again.
    for u2 in [*ends[1:], *rest]:
        slope = (finite[u2] - p1) / (u2 - u1)
        if slope > 0:
            return max(0, math.floor(u1 + (limit - p1) / slope)), "line"
    return None, ""  # a peak that does not grow along the axis: no line to follow


def _xla_line(
    finite: Mapping[int, int],
    xla: Mapping[int, tuple[int, bool]],
    limit: int,
    lo: int,
    hi: int | None,
) -> int | None:
    """Where the peak crosses ``limit`` past XLA's plateau, in units; None where no end of
    the bracket is on it, or no point past it is known.

    XLA's own remat pass works to a goal under the memory it is told the device has. Where
    a step's peak would pass that goal, the pass recomputes buffers the policy keeps until
    the peak is under it: a plateau that does not grow along the axis, on which no line
    points at the boundary. Where it cannot get under the goal, it takes off all it can,
    which grows with the batch as the activations do (measured on a 4-layer GPT under
    ``none``: 0.3957, 0.3957, 0.3956 and 0.3932 GiB per sample at batch 51, 55, 70 and
    88). So past the plateau the peak follows the line of the peaks before the pass (peak
    plus what the pass took off: a line in the batch) less that cut per unit: from the
    point nearest the bracket where the pass fell short, that slope reaches the boundary
    (there 1.554 - 0.396 = 1.158 GiB per sample against 1.157 measured).
    """
    held = {u for u, (cut, short) in xla.items() if cut and not short}
    if lo not in held and hi not in held:
        return None  # both ends off the plateau: the line through them holds
    short = [u for u, (cut, fell) in xla.items() if fell and cut and u in finite]
    if not short:
        return None
    ends = [u for u in (lo, hi) if u]
    at = min(short, key=lambda u: min(abs(math.log(u / e)) for e in ends))
    before = {u: p + xla.get(u, (0, False))[0] for u, p in finite.items()}
    a, b = min(before), max(before)
    if a == b:
        return None
    slope = (before[b] - before[a]) / (b - a) - xla[at][0] / at
    if slope <= 0:
        return None
    return max(0, math.floor(at + (limit - finite[at]) / slope))


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


def plan_at(
    full: Fit,
    workload: Workload,
    *,
    limit_bytes: int | None,
    headroom: float,
    offload: bool,
    hide: float,
    extra: Iterable[Any],
    compiles: Callable[[], int],
    t0: float,
) -> tuple[Fit, Plan]:
    """The cheapest plan at the boundary ``full`` (the search's answer under ``full``, which
    fits) found, and that answer rewritten as the plan's: its policy, peak and overhead.

    Args:
      full: the boundary search's fit under ``full`` (one that fits).
      workload: the step at the boundary (at ``full.seq``); the plan is for ``full.batch``.
      limit_bytes, headroom, offload, hide, extra: as ``plan`` takes them.
      compiles: the compiles the whole search made so far (called after the plan).
      t0: when the search began (``time.perf_counter()``).

    Returns:
      ``(fit, plan)``; the fit's note is ``plan_at_max_batch`` or ``plan_at_max_seq``.
    """
    p = plan(
        workload,
        full.batch,
        limit_bytes,
        headroom=headroom,
        offload=offload,
        hide=hide,
        extra=extra,
    )
    kind = f"plan_at_max_{full.axis}"
    fit = dataclasses.replace(
        full,
        policy=p.policy.spec,
        schedule=p.schedule.spec,
        peak_bytes=p.peak_bytes,
        recompute_overhead=p.recompute_overhead,
        compiles=compiles(),
        seconds=time.perf_counter() - t0,
        xla_remat=bool(p.report and p.report.xla_remat),
        xla_remat_bytes=p.report.xla_remat_saved_bytes if p.report is not None else 0,
        note=Note(kind, {f"max_{full.axis}": full.value, "plan": p.note}),
    )
    return fit, p
