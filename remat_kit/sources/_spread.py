"""Where a workload's independent compiles may run besides this process.

A search that needs several programs that do not depend on each other (a front's catalogue,
the two batches that close a boundary) asks its workload for all of them at once
(:meth:`~remat_kit.sources.Workload.compile_all`). Without a :class:`Spread` they compile
here, one after the other. With one, they go through :func:`remat_kit._workers.run`, the
seam every search shares: local worker processes (``jobs``) or an executor (a Dask
cluster's), each worker building the same workload with ``workload_for`` and sending back
the report, which joins the workload's caches here.

Example:
  >>> import functools
  >>> s = Spread(functools.partial(rk.sources.workload, "tiny-llama", "h100"), jobs=2)
  >>> s.side_by_side
  True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING

from remat_kit.analysis import MemoryReport
from remat_kit.errors import BadType
from remat_kit.policies import as_policy
from remat_kit.schedules import parse_schedule

if TYPE_CHECKING:
    from remat_kit.sources._workload import Workload

__all__ = [
    "SLOW_SECONDS",
    "Spread",
    "compile_in_worker",
]

#: A compile worth a second process, in seconds. A spawned worker imports jax and
#: remat-kit, builds the step and traces it in about 3 s (a 32-layer unrolled Llama on this
#: 2-core machine, ``experiments/side_by_side.py``). Measured there, ``max_batch``'s pair side
#: by side against one by one: 12.8 vs 13.3 s and 14.1 vs 14.9 s where each compile takes
#: about 4 s (the scanned stack), 0.70-0.79x the wall time of ``fit`` where each takes 16-22 s
#: (unrolled). Below this the gain is within the noise, and the far side compiled beside the
#: near one is wasted where the near one turns out not to fit.
SLOW_SECONDS = 8.0


@dataclasses.dataclass(frozen=True)
class Spread:
    """Where a workload's independent compiles may run besides this process.

    Attributes:
      workload_for: builds the same workload in a worker process; it must pickle (a
        module-level function or a ``functools.partial`` of one).
      jobs: local worker processes at most (1: none, unless ``executor`` is given).
      executor: a ``concurrent.futures.Executor`` to send them to instead (a Dask cluster's,
        :func:`remat_kit._workers.connect`).
      slow_seconds: a pair of programs is compiled side by side only where a program of
        the search took longer than this here (see :data:`SLOW_SECONDS`).

    Raises:
      TypeError: ``workload_for`` is not callable, or ``jobs`` not a positive int.

    Example:
      >>> Spread(lambda: None, jobs=1).side_by_side
      False
    """

    workload_for: Callable[[], Workload]
    jobs: int = 1
    executor: Executor | None = None
    slow_seconds: float = SLOW_SECONDS

    def __post_init__(self) -> None:
        if not callable(self.workload_for):
            raise BadType(
                f"workload_for must be callable, got {self.workload_for!r}", param="workload_for"
            )
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise BadType(f"jobs must be a positive int, got {self.jobs!r}", param="jobs")

    @property
    def side_by_side(self) -> bool:
        """Whether programs can compile anywhere but here (workers, or an executor)."""
        return self.jobs > 1 or self.executor is not None


def compile_in_worker(
    workload_for: Callable[[], Workload], whole: bool, item: tuple[str, str, int]
) -> MemoryReport:
    """One program compiled in a worker: ``item`` is ``(policy spec, schedule spec, batch)``
    of a workload ``workload_for`` builds; ``whole``: the full step of an unrolled model, not
    read off shallow copies (:meth:`Workload.whole`)."""
    spec, schedule, batch = item
    w = workload_for()
    pol, sch = as_policy(spec), parse_schedule(schedule)
    return w.whole(pol, sch, batch) if whole else w.compiled(pol, sch, batch)
