"""What the two boundary searches share: the bracket of compiled peaks and the plan at the end.

:func:`~remat_kit.search._batch.max_batch` walks the batch (its peak is near a line in it) and
:func:`~remat_kit.search._seq.max_seq` the sequence (a line under flash attention, a parabola
where the scores are held); both keep the compiled peaks by unit of their axis, read the
bracket off them the same way, and end in :func:`plan_at`: the cheapest plan at the boundary
``full`` reaches.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any

from remat_kit.notes import Note
from remat_kit.search._planner import Plan, plan
from remat_kit.search._workload import Workload

#: The "peak" of a point XLA or the model refused to build: over any limit.
UNBUILDABLE = 1 << 62


def bracket(known: dict[int, int], limit: int) -> tuple[int, int | None]:
    """The largest unit known to fit (0: none) and the smallest larger one known not to
    (None: none), from compiled peaks by unit.

    Example:
      >>> bracket({1: 5, 2: 9, 4: 30, 3: 12}, limit=10)
      (2, 3)
    """
    lo = max((u for u, p in known.items() if p <= limit), default=0)
    hi = min((u for u, p in known.items() if p > limit and u > lo), default=None)
    return lo, hi


def plan_at[Fit](
    full: Fit,
    workload: Workload,
    batch: int,
    *,
    limit_bytes: int | None,
    headroom: float,
    offload: bool,
    hide: float,
    extra: Iterable[Any],
    compiles: Callable[[], int],
    t0: float,
    note: Callable[[Note], Note],
) -> tuple[Fit, Plan]:
    """The cheapest plan at the boundary ``full`` (the search's answer under ``full``, which
    fits) found, and that answer rewritten as the plan's: its policy, peak and overhead.

    Args:
      full: the boundary search's fit under ``full`` (a BatchFit or SeqFit that fits).
      workload: the step at the boundary.
      batch: its batch.
      limit_bytes, headroom, offload, hide, extra: as ``plan`` takes them.
      compiles: the compiles the whole search made so far (called after the plan).
      t0: when the search began (``time.perf_counter()``).
      note: the plan's note -> the fit's (``plan_at_max_batch``, ``plan_at_max_seq``).

    Returns:
      ``(fit, plan)``.
    """
    p = plan(
        workload, batch, limit_bytes, headroom=headroom, offload=offload, hide=hide, extra=extra
    )
    fit = dataclasses.replace(
        full,
        policy=p.policy.spec,
        schedule=p.schedule.spec,
        peak_bytes=p.peak_bytes,
        recompute_overhead=p.recompute_overhead,
        compiles=compiles(),
        seconds=time.perf_counter() - t0,
        xla_remat=bool(p.report and p.report.xla_remat),
        note=note(p.note),
    )
    return fit, p
