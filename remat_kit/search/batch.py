"""The largest batch: for one policy (:func:`max_batch`) or for any plan (:func:`max_batch_plan`).

Example:
  >>> import remat_kit as rk                                           # doctest: +SKIP
  >>> fit = rk.max_batch(w, "full")
  >>> fit.max_batch, fit.peak_bytes <= fit.limit_bytes
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from remat_kit.policies import Policy, as_policy
from remat_kit.schedules import Schedule, label, parse_schedule
from remat_kit.search.budget import DEFAULT_HEADROOM, GIB, limit_for
from remat_kit.search.planner import Plan, plan
from remat_kit.search.workload import DEFAULT_HIDE, FULL, Workload

__all__ = [
    "BatchFit",
    "max_batch",
    "max_batch_plan",
]


@dataclasses.dataclass(frozen=True)
class BatchFit:
    """The largest batch that fits, for one policy and schedule.

    Attributes:
      policy, schedule: what was measured (specs).
      max_batch: the largest batch whose compiled peak is within ``limit_bytes`` (0: even the
        smallest batch does not fit).
      peak_bytes: compiled peak at ``max_batch`` (at the smallest batch when it is 0).
      next_peak_bytes: compiled peak at the next larger batch (the proof it does not fit), or
        None when the search stopped at ``cap``.
      limit_bytes: device memory minus headroom.
      recompute_overhead: extra FLOPs of recomputation at ``max_batch``.
      tokens_per_step: ``max_batch`` x sequence length.
      compiles: programs compiled for this search (cached ones not counted).
      seconds: wall time of the search.
      xla_remat: XLA's own rematerialization pass changed the program at ``max_batch``.
      message: one line for the user.
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
    message: str = ""

    @property
    def fits(self) -> bool:
        """At least the smallest batch fits."""
        return self.max_batch > 0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fits": self.fits}


def max_batch(
    workload: Workload,
    policy: Any = "full",
    schedule: Any = "none",
    *,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int = 1 << 14,
) -> BatchFit:
    """The largest batch whose compiled peak fits the device minus ``headroom``.

    Exponential search (doubling from ``start``) until a batch does not fit, then bisection
    between the last batch that fit and the first that did not; every probe is a compiled
    report for the workload's target, cached in the workload. Peak memory is assumed to grow
    with the batch (it does: activations scale with it, the rest is constant).

    Args:
      workload: the step to compile.
      policy: policy name/spec or Policy.
      schedule: layer schedule spec or Schedule.
      headroom: fraction of device memory left free (see ``DEFAULT_HEADROOM``).
      limit_bytes: an explicit limit instead of device memory minus headroom.
      start: first batch probed (rounded to ``workload.batch_multiple``); default the multiple.
      cap: stop searching above this batch.

    Returns:
      A BatchFit; ``max_batch == 0`` when even the smallest batch does not fit.

    Raises:
      ValueError: a target without a memory size and no ``limit_bytes``; a bad headroom.

    Example:
      >>> fit = rk.max_batch(w, "full")                                    # doctest: +SKIP
      >>> fit.max_batch, fit.peak_bytes <= fit.limit_bytes
      (13, True)
    """
    t0 = time.perf_counter()
    before = workload.compiles
    pol, sch = as_policy(policy), parse_schedule(schedule)
    limit = (
        limit_for(workload.target, limit_bytes, headroom) if limit_bytes is None else limit_bytes
    )
    step = max(1, int(workload.batch_multiple))
    units_cap = max(1, cap // step)

    def peak(units: int) -> int:
        return workload._compiled(pol, sch, units * step).peak_bytes

    lo = max(1, (start or step) // step)
    if peak(lo) > limit:
        # Walk down by halving: the largest fitting batch is below start.
        hi = lo
        while lo > 1:
            lo = max(1, lo // 2)
            if peak(lo) <= limit:
                break
            hi = lo
        else:
            if peak(1) > limit:
                return _no_fit(workload, pol, sch, step, limit, before, t0)
        if peak(lo) > limit:
            return _no_fit(workload, pol, sch, step, limit, before, t0)
    else:
        hi = None
        while hi is None:
            nxt = min(lo * 2, units_cap)
            if nxt == lo:
                break
            if peak(nxt) <= limit:
                lo = nxt
            else:
                hi = nxt
    if hi is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if peak(mid) <= limit:
                lo = mid
            else:
                hi = mid
    best = workload._compiled(pol, sch, lo * step)
    nxt_peak = peak(hi) if hi is not None else None
    batch = lo * step
    overhead = workload._recompute(pol, sch, batch)
    msg = (
        label(pol.spec, sch.spec)
        + f": batch {batch} fits ({best.peak_bytes / GIB:.2f} GiB of {limit / GIB:.2f} GiB)"
        + (
            f", batch {hi * step} does not ({nxt_peak / GIB:.2f} GiB)"
            if nxt_peak is not None
            else f"; stopped at the cap {cap}"
        )
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
        message=msg,
    )


def _no_fit(
    workload: Workload, pol: Policy, sch: Schedule, step: int, limit: int, before: int, t0: float
) -> BatchFit:
    r = workload._compiled(pol, sch, step)
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
        message=(
            f"{pol.spec}: even batch {step} does not fit: {r.peak_bytes / GIB:.2f} GiB > "
            f"{limit / GIB:.2f} GiB on {workload.target.name}"
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

    Example:
      >>> fit, p = rk.max_batch_plan(w)                                   # doctest: +SKIP
    """
    t0 = time.perf_counter()
    before = workload.compiles
    full = max_batch(workload, FULL, headroom=headroom, start=start)
    if not full.fits:
        return full, None
    p = plan(
        workload, full.max_batch, None, headroom=headroom, offload=offload, hide=hide, extra=extra
    )
    fit = dataclasses.replace(
        full,
        policy=p.policy.spec,
        schedule=p.schedule.spec,
        peak_bytes=p.peak_bytes,
        recompute_overhead=p.recompute_overhead,
        compiles=workload.compiles - before,
        seconds=time.perf_counter() - t0,
        xla_remat=bool(p.report and p.report.xla_remat),
        message=f"plan at the max batch of full ({full.max_batch}): {p.message}",
    )
    return fit, p
