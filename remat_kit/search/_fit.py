"""How large a step fits, along one axis: :func:`fit`, the one door to both boundary searches.

The batch and the sequence are searched the same way (``boundary``: first probes, a curve
through the compiled peaks, two compiles either side of the answer); they differ in what a
probe is. A batch is a parameter of one program (the workload's own caches); a sequence is a
new program (``Workload.at(seq=)``, built once for every search over it). :func:`fit` takes
the workload and the axis, and gives a :class:`~remat_kit.search.Fit` for either, for one
policy or for the planner (``"plan"``).

Example:
  >>> w = rk.sources.workload(tiny_model, "h100", rk.TrainConfig(1, 64, optimizer="sgd"))
  >>> f = rk.fit(w, "full", axis="seq", granularity=64, limit_bytes=2**20)
  >>> f.axis, f.seq % 64, f.peak_bytes <= f.limit_bytes < f.next_peak_bytes
  ('seq', 0, True)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from remat_kit import _workers
from remat_kit.errors import BadType, BadValue
from remat_kit.policies import PolicyLike, as_policy
from remat_kit.search._batch import DEFAULT_BATCH_CAP, max_batch, max_batch_plan
from remat_kit.search._boundary import Fit
from remat_kit.search._budget import DEFAULT_HEADROOM
from remat_kit.search._seq import DEFAULT_GRANULARITY, DEFAULT_SEQ_CAP, max_seq, max_seq_plan
from remat_kit.sources._workload import DEFAULT_HIDE, Workload

__all__ = ["AXES", "PLAN", "fit", "fit_each"]

#: What :func:`fit` can search, and the largest value it tries on each where no cap is given.
AXES = {"batch": DEFAULT_BATCH_CAP, "seq": DEFAULT_SEQ_CAP}

#: The policy that stands for the planner: the cheapest plan at the boundary of ``full``
#: (and in ``fastest``'s policies, the planner's per-tag plans).
PLAN = "plan"


def fit(
    workload: Workload,
    policy: PolicyLike = "full",
    schedule: Any = "none",
    *,
    axis: str = "batch",
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    start: int | None = None,
    cap: int | None = None,
    granularity: int | None = None,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
) -> Fit:
    """The largest batch, or the longest sequence at the workload's batch, whose compiled
    peak fits the device minus ``headroom`` (or ``limit_bytes``).

    ``axis="batch"`` is :func:`~remat_kit.search.max_batch` (the sequence is the
    workload's); ``axis="seq"`` is :func:`~remat_kit.search.max_seq` over
    ``workload.at(seq=...)`` at ``workload.batch``. ``policy="plan"`` searches under
    ``full`` and then plans at the boundary found (``max_batch_plan``, ``max_seq_plan``).

    Args:
      workload: the step (``rk.sources.workload``); ``workload.at(batch=)`` sets the batch
        of a sequence search.
      policy: a policy name, spec or Policy, or ``"plan"``.
      schedule: a layer schedule (not with ``"plan"``: the planner picks it).
      axis: ``"batch"`` or ``"seq"``.
      headroom: fraction of the usable memory left free.
      limit_bytes: an explicit limit instead of the usable memory minus ``headroom``.
      start: the first batch or sequence probed.
      cap: the largest searched (default: ``AXES[axis]``).
      granularity: tokens between the sequences searched (``axis="seq"`` only; default
        ``DEFAULT_GRANULARITY``).
      offload, hide, extra: the planner's (``"plan"`` only), as :func:`plan` takes them.

    Returns:
      The :class:`~remat_kit.search.Fit` along ``axis``.

    Raises:
      BadValue: an unknown axis; ``granularity`` with ``axis="batch"``; a schedule with
        ``"plan"``; what the search itself refuses (see ``max_batch`` and ``max_seq``).
      BadType: a workload that is not an ``rk.Workload``.
    """
    if not isinstance(workload, Workload):
        raise BadType(
            f"workload must be an rk.Workload (rk.sources.workload), got {type(workload).__name__}",
            param="workload",
        )
    if axis not in AXES:
        raise BadValue(f"axis={axis!r}: use one of {', '.join(map(repr, AXES))}", param="axis")
    if axis == "batch" and granularity is not None:
        raise BadValue(
            f"granularity={granularity} with axis='batch': batches step by the workload's "
            f"batch_multiple ({workload.batch_multiple}); granularity is the sequence search's",
            param="granularity",
        )
    planner = isinstance(policy, str) and policy == PLAN
    if planner and schedule not in ("none", None):
        raise BadValue(
            f"schedule={schedule!r} with policy='plan': the planner picks the schedule; drop it",
            param="schedule",
        )
    cap = AXES[axis] if cap is None else cap
    bounds = dict(headroom=headroom, limit_bytes=limit_bytes, start=start)
    plans = dict(offload=offload, hide=hide, extra=extra)
    if axis == "batch":
        if planner:
            return max_batch_plan(workload, cap=cap, **bounds, **plans)[0]
        return max_batch(workload, policy, schedule, cap=cap, **bounds)
    step = DEFAULT_GRANULARITY if granularity is None else granularity
    seqs = dict(batch=workload.batch, granularity=step, cap=cap)
    if planner:
        return max_seq_plan(workload, **seqs, **bounds, **plans)[0]
    return max_seq(workload, policy, schedule, **seqs, **bounds)


def fit_each(
    workload: Workload,
    policies: Sequence[PolicyLike],
    schedule: Any = "none",
    *,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    started: Callable[[int], None] | None = None,
    ended: Callable[[int, Fit, bool], None] | None = None,
) -> list[Fit]:
    """The largest batch of each policy (:func:`fit` along ``batch``; ``"plan"``: the
    planner's, which picks its own schedule), in the order given.

    The searches do not depend on each other. Where the workload's spread has an executor
    (``rk.sources.Spread``: a cluster), the first runs here and, once it compiled, the others
    on the executor's workers, each rebuilding the step with ``spread.workload_for`` (a
    custom policy, a jax callable, cannot travel: then every search runs here).

    Args:
      workload: the step.
      policies: policy names, specs or Policies, or ``"plan"``.
      schedule: the layer schedule of every named policy.
      headroom, limit_bytes, offload, hide: as :func:`fit` takes them.
      started: called with a policy's index before its search starts here (one by one).
      ended: called as ``ended(index, fit, here)`` when a search is over (``here``: in this
        process, its compiles counted in ``workload.compiles``).

    Returns:
      The fits, in the order of ``policies``.

    Example:
      >>> [(f.policy, f.batch > 2) for f in rk.search.fit_each(w, ["full"], limit_bytes=2**20)]
      [('full', True)]
    """
    typed = [None if isinstance(p, str) and p == PLAN else as_policy(p) for p in policies]
    options = dict(headroom=headroom, limit_bytes=limit_bytes, offload=offload, hide=hide)
    sch = getattr(schedule, "spec", schedule)
    spread = workload.spread
    travel = (
        spread is not None
        and spread.executor is not None
        and all(p is None or p.name != "custom" for p in typed)
    )
    # What travels: a policy's spec (a worker parses it again), "plan" for the planner.
    items = [PLAN if p is None else p.spec for p in typed]
    local: set[int] = set()

    def here(i: int) -> Fit:
        local.add(i)
        return _one(lambda: workload, schedule, options, typed[i] or PLAN)

    def done(i: int, found: Fit) -> None:
        if ended is not None:
            ended(i, found, i in local)

    if not travel:
        fits = []
        for i in range(len(items)):
            if started is not None:
                started(i)
            fits.append(here(i))
            done(i, fits[-1])
        return fits
    one = functools.partial(_by_index, spread.workload_for, sch, options, items)
    return _workers.run(
        one, range(len(items)), 1, executor=spread.executor, here=here, on_done=done
    )


def _by_index(
    workload_for: Callable[[], Workload],
    schedule: str,
    options: dict[str, Any],
    items: Sequence[str],
    i: int,
) -> Fit:
    """:func:`_one` of ``items[i]`` (module-level: a cluster's worker is handed it)."""
    return _one(workload_for, schedule, options, items[i])


def _one(
    workload_for: Callable[[], Workload], schedule: Any, options: dict[str, Any], policy: Any
) -> Fit:
    """One policy's largest batch on the step ``workload_for`` builds; no start: the search
    begins where the trace puts the boundary."""
    planner = isinstance(policy, str) and policy == PLAN
    return fit(workload_for(), policy, "none" if planner else schedule, axis="batch", **options)
