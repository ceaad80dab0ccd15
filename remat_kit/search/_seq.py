"""The longest sequence: for one policy (:func:`max_seq`) or for any plan (:func:`max_seq_plan`).

The sequence changes the traced program (every activation's shape, the attention kernel's),
so the search probes one workload per sequence, each compiled at a fixed batch: those
``Workload.at(seq=)`` gives (or a builder ``seq -> Workload``'s).

Example:
  >>> w = rk.sources.workload(tiny_model, "h100", rk.TrainConfig(1, 64, optimizer="sgd"))
  >>> fit = rk.search.max_seq(w, "full", granularity=64, limit_bytes=2**20)
  >>> fit.seq % 64, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes
  (0, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from jax.errors import JaxRuntimeError

from remat_kit.errors import BadType, BadValue
from remat_kit.notes import Note
from remat_kit.policies import FULL, PolicyLike, as_policy
from remat_kit.schedules import parse_schedule
from remat_kit.search._boundary import CURVES, Fit, Peaks, plan_at, search
from remat_kit.search._budget import DEFAULT_HEADROOM, limit_for
from remat_kit.search._planner import Plan
from remat_kit.sources._workload import DEFAULT_HIDE, Workload

__all__ = [
    "DEFAULT_GRANULARITY",
    "DEFAULT_SEQ_CAP",
    "max_seq",
    "max_seq_plan",
    "seq_multiple",
]

#: Tokens between two sequences the search tells apart (``--seq-step``).
DEFAULT_GRANULARITY = 1024

#: The longest sequence searched (1M tokens) where the caller gives no cap.
DEFAULT_SEQ_CAP = 1 << 20

#: A builder: the step at a sequence length, as a Workload (its ``seq`` that length).
Builder = Callable[[int], Workload]


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


def _probes(build: Builder | Workload | _Probes) -> _Probes:
    if isinstance(build, _Probes):
        return build
    if isinstance(build, Workload):
        return _Probes(lambda seq: build.at(seq=seq))
    return _Probes(build)


def _units(granularity: Any, batch: Any, start: Any, cap: Any) -> tuple[int, int, int]:
    """The search's sizes, checked before anything is built: ``(granularity, first unit
    probed, cap in units)``.

    Raises:
      BadType: a size that is not an int.
      BadValue: a size below 1, or a cap below the granularity.
    """
    g = _check_int("granularity", granularity)
    _check_int("batch", batch)
    _check_int("cap", cap)
    if start is not None:
        _check_int("start", start)
    if cap < g:
        raise BadValue(f"cap={cap} is below granularity={g}: nothing to search", param="cap")
    units_cap = cap // g
    return g, 1 if start is None else min(max(1, start // g), units_cap), units_cap


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(f"{name} must be an int, got {value!r}", param=name)
    if value < minimum:
        raise BadValue(f"{name}={value} must be at least {minimum}", param=name)
    return value


def max_seq(
    build: Builder | Workload,
    policy: PolicyLike = "full",
    schedule: Any = "none",
    *,
    batch: int | None = None,
    granularity: int = DEFAULT_GRANULARITY,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = DEFAULT_SEQ_CAP,
) -> Fit:
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
       steps) until the boundary is bracketed, then bisects (the one boundary search,
       :func:`~remat_kit.search._boundary.search`). A sequence
       that could not be built (below) is followed by one bisection step: no curve
       predicts it.

    Every probe is a compiled report for the workload's target, cached in its workload. A
    sequence XLA refuses to build (``JaxRuntimeError``: a kernel grid or an index past what
    the GPU or int32 allows) or the builder refuses (``BadValue``: past a model's learned
    positions, a length the mesh cannot split) counts as one that does not fit; refusing
    the shortest is an error. The refused lengths must be the long ones: a builder must not
    refuse a sequence and accept a longer one (choose a ``granularity`` the mesh divides).

    Args:
      build: a Workload (the search probes ``build.at(seq=s)``, which builds each sequence
        once for every search over it), or a builder ``seq -> Workload``: the step at that
        sequence (``workload.seq == seq``), called once per sequence probed.
      policy: policy name/spec or Policy.
      schedule: layer schedule spec or Schedule.
      batch: sequences per step (a multiple of the workload's ``batch_multiple``); None:
        the Workload's :attr:`~remat_kit.sources.Workload.batch`, or 1 for a builder.
      granularity: tokens between the sequences searched; every sequence probed is a multiple.
      headroom: fraction of the usable memory left free (see ``DEFAULT_HEADROOM``).
      limit_bytes: an explicit limit instead of the usable memory minus headroom.
      start: first sequence probed (rounded down to a multiple of ``granularity``).
      cap: the longest sequence searched; the search stops there.

    Returns:
      A :class:`~remat_kit.search.Fit` along ``seq``; its ``seq`` is 0 when even
      ``granularity`` tokens do not fit. ``compiles``
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
      >>> fit.seq > 64, fit.peak_bytes <= fit.limit_bytes < fit.next_peak_bytes
      (True, True)
    """
    t0 = time.perf_counter()
    if batch is None:
        batch = build.batch if isinstance(build, Workload) else 1
    probes = _probes(build)
    before = probes.compiles
    g, first, units_cap = _units(granularity, batch, start, cap)
    pol, sch = as_policy(policy), parse_schedule(schedule)
    w0 = probes(g)  # built, not compiled: its target and batch rules come before any compile
    if batch % w0.batch_multiple:
        raise BadValue(
            f"batch={batch} does not split into the step's {w0.batch_multiple} "
            "(gradient-accumulation steps x data-parallel GPUs); use a multiple of "
            f"{w0.batch_multiple}",
            param="batch",
        )
    limit = limit_for(w0.target, limit_bytes, headroom) if limit_bytes is None else limit_bytes
    # A sequence XLA or the model cannot build does not run either: an upper bound.
    peak = Peaks(
        lambda units: probes(units * g).compiled(pol, sch, batch).peak_bytes,
        (JaxRuntimeError, BadValue),
    )
    peak(first)
    if peak.known[first] <= limit and first < units_cap:
        peak(min(2 * first, units_cap))
    lo, hi, method, predicted = search(peak, peak.known, limit, units_cap, CURVES["seq"])
    common = dict(policy=pol.spec, schedule=sch.spec, batch=batch, unit=g, limit_bytes=limit)
    if lo == 0:
        r = probes(g).compiled(pol, sch, batch)
        return Fit(
            "seq",
            seq=0,
            peak_bytes=r.peak_bytes,
            next_peak_bytes=r.peak_bytes,
            recompute_overhead=None,
            compiles=probes.compiles - before,
            seconds=time.perf_counter() - t0,
            xla_remat=r.xla_remat,
            xla_remat_bytes=r.xla_remat_saved_bytes,
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
            predicted=None if predicted is None else predicted * g,
            method=method,
            attention=r.attention,
            **common,
        )
    seq = lo * g
    w = probes(seq)
    best = w.compiled(pol, sch, batch)
    refusal = peak.refused.get(hi) if hi is not None else None
    reason = None
    if refusal is not None:
        who = "XLA" if issubclass(refusal[0], JaxRuntimeError) else "the model"
        reason = f"{who}: {refusal[1]}"
    nxt_peak = None if hi is None or reason is not None else peak.known[hi]
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
    return Fit(
        "seq",
        seq=seq,
        peak_bytes=best.peak_bytes,
        next_peak_bytes=nxt_peak,
        recompute_overhead=w.recompute_of(pol, sch, batch),
        compiles=probes.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=best.xla_remat,
        xla_remat_bytes=best.xla_remat_saved_bytes,
        note=note,
        predicted=None if predicted is None else predicted * g,
        method=method or "first probes",
        attention=best.attention,
        **common,
    )


def max_seq_plan(
    build: Builder | Workload,
    *,
    batch: int | None = None,
    granularity: int = DEFAULT_GRANULARITY,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = DEFAULT_SEQ_CAP,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
) -> tuple[Fit, Plan | None]:
    """The longest sequence any plan reaches, and the cheapest plan at that sequence.

    The sequence is :func:`max_seq` of ``full`` (the planner's end point: everything
    recomputed); the plan at that sequence then keeps what the memory left allows.

    Args:
      build: a Workload or a builder ``seq -> Workload``, as for :func:`max_seq` (its
        workloads need residuals (``Workload.plannable``), as ``rk.sources.workload`` gives them).
      batch, granularity, headroom, limit_bytes, start, cap: as for :func:`max_seq`.
      offload, hide, extra: as for :func:`plan`.

    Returns:
      ``(fit, plan)``: the Fit of the plan (its policy, peak and overhead), and the Plan,
      or None when even the shortest sequence does not fit.

    Raises:
      ValueError, TypeError: as :func:`max_seq` and :func:`plan` raise them.

    Example:
      >>> def at(seq):
      ...     config = rk.TrainConfig(batch=1, seq=seq, optimizer="sgd")
      ...     return rk.sources.workload(tiny_model, "h100", config)
      >>> fit, p = rk.search.max_seq_plan(at, granularity=64, limit_bytes=2**20)
      >>> fit.seq > 64, p.fits, p.peak_bytes <= 2**20
      (True, True, True)
    """
    t0 = time.perf_counter()
    if batch is None:
        batch = build.batch if isinstance(build, Workload) else 1
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
        probes(full.seq),
        limit_bytes=limit_bytes,
        headroom=headroom,
        offload=offload,
        hide=hide,
        extra=extra,
        compiles=lambda: probes.compiles - before,
        t0=t0,
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
