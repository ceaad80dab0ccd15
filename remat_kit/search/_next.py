"""The one next step that works when nothing fits: changes tried in order, each decided by a
compile.

The caller lists the changes to the step it can make (a bigger GPU, more GPUs sharded, LoRA,
gradient accumulation), cheapest to the user first, each with the Workload it makes.
:func:`next_step` skips, without compiling, a change whose fixed parts (weights, gradients,
optimizer state, batch: the breakdown's arithmetic; gradients aside, which an unrolled stack
need not hold at once) are still over the limit, compiles the
step under ``full`` (the most frugal per-layer policy) for the first that passes, and stops at
the first that fits or after ``max_compiles`` compiles. The answer is the compiled peak against
the usable memory of the changed target: the limit every report's ``fits`` uses.

Example:
  >>> cfg = rk.TrainConfig(batch=2, seq=16, optimizer="sgd")
  >>> change = Change("bigger_gpu", {"target": "h200"},
  ...                 lambda: rk.sources.workload(tiny_model, "h200", cfg), batch=2)
  >>> step = next_step([change])
  >>> step.fits, step.compiles, step.change.kind
  (True, 1, 'bigger_gpu')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from remat_kit.errors import BadValue
from remat_kit.notes import Note, words
from remat_kit.policies import FULL
from remat_kit.schedules import NO_SCHEDULE
from remat_kit.search._budget import limit_for
from remat_kit.sources._workload import FIXED_PARTS, Workload

__all__ = [
    "CHANGE_KINDS",
    "Change",
    "NextStep",
    "next_step",
]

#: The kinds of change a next step may be, with the keys of their figures.
CHANGE_KINDS: Mapping[str, tuple[str, ...]] = {
    "accum": ("accum", "micro_batch"),  # gradient accumulation: the same global batch
    "smaller_batch": ("batch",),
    "bigger_gpu": ("target",),
    "shard": ("target", "devices", "batch"),  # fsdp over this many GPUs, at a global batch
    "lora": ("rank",),
}

#: Compiles a next step may cost by default: it is an answer, not a search.
DEFAULT_MAX_COMPILES = 2


@dataclasses.dataclass(frozen=True)
class Change:
    """One change to the step: what it is (as data) and the step it makes.

    Attributes:
      kind: one of :data:`CHANGE_KINDS`.
      data: its figures (the keys :data:`CHANGE_KINDS` lists).
      workload: builds the changed step's Workload (called only when the change is tried).
      batch: the batch to compile the changed step at.

    Raises:
      BadValue: an unknown kind, or figures with other keys.
    """

    kind: str
    data: Mapping[str, Any]
    workload: Callable[[], Workload] = dataclasses.field(compare=False, repr=False)
    batch: int = 1

    def __post_init__(self) -> None:
        keys = CHANGE_KINDS.get(self.kind)
        if keys is None or set(self.data) != set(keys):
            raise BadValue(
                f"a change is one of {', '.join(CHANGE_KINDS)} with its figures; got "
                f"{self.kind!r} {dict(self.data)!r}",
                param="change",
            )

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., **data}``: what a note holds."""
        return {"kind": self.kind, **self.data}


@dataclasses.dataclass(frozen=True)
class NextStep:
    """What :func:`next_step` found.

    Attributes:
      change: the change that fits (None: none of those compiled did).
      fits: whether one did.
      peak_bytes: its compiled peak under ``full`` (None when nothing fits).
      limit_bytes: the usable memory of its target (None when nothing fits).
      compiles: programs compiled to find it (the cache's answers count too).
      tried: ``(change, peak bytes or None)`` for every change looked at, in order; None: its
        fixed parts alone were over the limit, so it was not compiled.
      note: the answer as data (kind ``next_step_fits`` or ``next_step_none``).
    """

    change: Change | None
    fits: bool
    peak_bytes: int | None
    limit_bytes: int | None
    compiles: int
    tried: tuple[tuple[Change, int | None], ...]
    note: Note

    @property
    def message(self) -> str:
        """The note in words."""
        return words(self.note)


def next_step(
    changes: Sequence[Change],
    *,
    max_compiles: int = DEFAULT_MAX_COMPILES,
    progress: Callable[[str], None] | None = None,
) -> NextStep:
    """The first of ``changes`` whose step, compiled under ``full``, fits its target.

    Args:
      changes: what to try, in the order to try them (the smallest change to the user first).
      max_compiles: compiles allowed (at least 1); changes after the last are not tried.
      progress: called with a few words before each compile.

    Returns:
      A NextStep.

    Raises:
      BadValue: ``max_compiles`` below 1.
    """
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int) or max_compiles < 1:
        raise BadValue(f"max_compiles={max_compiles!r} must be a positive int")
    tried: list[tuple[Change, int | None]] = []
    compiles = 0
    for change in changes:
        if compiles >= max_compiles:
            break
        w = change.workload()
        limit = limit_for(w.target, None, 0.0)
        # What is an input whatever the program does (check_budget's floor: XLA may free an
        # unrolled stack's gradients as it goes) over the limit: no compile can fit.
        parts = w.breakdown(change.batch)
        if sum(parts.get(k, 0) for k in FIXED_PARTS if k != "gradients") > limit:
            tried.append((change, None))
            continue
        if progress is not None:
            progress(f"compiling full for {_short(change)}")
        before = w.compiles
        report = w.verified(FULL, NO_SCHEDULE, change.batch, limit)
        compiles += max(1, w.compiles - before)
        tried.append((change, report.peak_bytes))
        if report.peak_bytes <= limit:
            note = Note(
                "next_step_fits",
                {
                    "change": change.to_dict(),
                    "target": w.target.name,
                    "policy": FULL.spec,
                    "peak_bytes": report.peak_bytes,
                    "limit_bytes": limit,
                    "compiles": compiles,
                },
            )
            return NextStep(change, True, report.peak_bytes, limit, compiles, tuple(tried), note)
    note = Note(
        "next_step_none",
        {
            "tried": [{**c.to_dict(), "peak_bytes": peak} for c, peak in tried],
            "compiles": compiles,
        },
    )
    return NextStep(None, False, None, None, compiles, tuple(tried), note)


def _short(change: Change) -> str:
    d = change.data
    return {
        "accum": lambda: f"accumulation over {d['accum']}",
        "smaller_batch": lambda: f"batch {d['batch']}",
        "bigger_gpu": lambda: d["target"],
        "shard": lambda: f"{d['devices']} x {d['target']} (fsdp, batch {d['batch']})",
        "lora": lambda: f"LoRA rank {d['rank']}",
    }[change.kind]()
