"""The fastest way to train a step: predicted tokens/s per policy at the batches that fit.

Checkpointing trades time for memory, and memory buys batch: a policy that recomputes may fit
a larger batch, whose products run closer to the GPU's peak and whose optimizer update is
shared by more tokens. :func:`fastest` answers which choice trains fastest on the workload's
GPU: for each policy (and the planner's per-tag plans), the micro-batches that fit (the
largest, from :func:`remat_kit.search.max_batch`, and the largest power of two under it), each
compiled and its step time predicted from the compiled program (:mod:`remat_kit.timing`);
with a global batch, the micro-batch x accumulation that reaches it fastest. The winner is
compared with ``none`` at its own largest batch.

Example (``w`` is the workload of a small model, as ``rk.sources.workload`` builds it):
  >>> f = rk.search.fastest(w, ["full"], limit_bytes=2**20)
  >>> [r.policy for r in f.rows], f.winner.tokens_per_second > 0, f.baseline.policy
  (['full'], True, 'none')
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any

from remat_kit import _workers
from remat_kit.errors import BadValue
from remat_kit.notes import Note, label
from remat_kit.policies import FULL, NO_REMAT, Policy, PolicyLike, as_policy
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.search._batch import max_batch
from remat_kit.search._budget import DEFAULT_HEADROOM, limit_for
from remat_kit.search._fit import PLAN
from remat_kit.search._planner import plan
from remat_kit.sources._workload import DEFAULT_HIDE, Workload

__all__ = [
    "Fastest",
    "Throughput",
    "fastest",
]


@dataclasses.dataclass(frozen=True)
class Throughput:
    """The fastest way one policy trains the step: its best micro-batch and what it gives.

    Attributes:
      policy, schedule: what was compiled (specs; for the planner, the plan it chose at
        ``micro_batch``).
      name: the row's name (``plan: <policy>`` for the planner's row).
      batch: sequences per optimizer step (the global batch; ``micro_batch x accum``).
      micro_batch: sequences per forward/backward pass (all data-parallel GPUs together).
      accum: gradient-accumulation steps per optimizer step.
      max_batch: the largest micro-batch that fits (0: none does).
      peak_bytes: the compiled peak at the chosen micro-batch (at the smallest when nothing
        fits); ``limit_bytes`` the limit it is held to.
      step_seconds: the predicted time of one optimizer step (None: the target has no rates,
        or nothing fits).
      tokens_per_second: ``batch x seq / step_seconds``, all GPUs together.
      mfu: model FLOPs utilisation of the step (recomputation not counted as useful work).
      recompute_overhead: extra FLOPs of recomputation at the chosen micro-batch.
      tried: ``(micro_batch, accum, tokens/s)`` of every compiled candidate, in the order tried.
      note: why nothing fits, as data (kind ``batch_none_fits``), else None.
      program: the fingerprint of the compiled program chosen (``MemoryReport.meta``), so
        rows that compile to the same program can be told (None: not known).
      same_as: for the planner's row, the catalogue row whose program it is at the same
        micro-batch (None: a program of its own).
    """

    policy: str
    schedule: str
    name: str
    batch: int
    micro_batch: int
    accum: int
    max_batch: int
    peak_bytes: int | None
    limit_bytes: int
    step_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    recompute_overhead: float | None
    tried: tuple[tuple[int, int, float | None], ...] = ()
    note: Note | None = None
    program: str | None = None
    same_as: str | None = None

    @property
    def fits(self) -> bool:
        """A micro-batch of this policy fits."""
        return self.batch > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, plus ``fits``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["tried"] = [list(t) for t in self.tried]
        out["note"] = None if self.note is None else self.note.to_dict()
        return {**out, "fits": self.fits}


@dataclasses.dataclass(frozen=True)
class Fastest:
    """The throughput search's answer: one row per policy, the winner and the baseline.

    Attributes:
      rows: one :class:`Throughput` per policy searched, in the order given.
      baseline: ``none`` at its own largest batch (or, with a global batch, at its fastest
        accumulation); None when ``none`` does not fit even one sequence.
      seq: tokens per sequence.
      global_batch: the global batch searched for (None: each policy's own batch).
      target: the target's name; ``devices`` how many GPUs the step runs on.
      compiles: programs compiled for the search; ``seconds`` its wall time.
    """

    rows: tuple[Throughput, ...]
    baseline: Throughput | None
    seq: int
    global_batch: int | None
    target: str
    devices: int
    compiles: int
    seconds: float

    @property
    def winner(self) -> Throughput | None:
        """The row with the most tokens/s (None: no row fits or has a predicted time)."""
        ranked = [r for r in self.rows if r.fits and r.tokens_per_second is not None]
        return max(ranked, key=lambda r: r.tokens_per_second, default=None)

    @property
    def margin(self) -> float | None:
        """How much faster the winner trains than the baseline: tokens/s ratio less one (None
        without either)."""
        win, base = self.winner, self.baseline
        if win is None or base is None or not base.tokens_per_second:
            return None
        return win.tokens_per_second / base.tokens_per_second - 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the rows, the baseline, the winner's name and the margin."""
        win = self.winner
        return {
            "rows": [r.to_dict() for r in self.rows],
            "baseline": None if self.baseline is None else self.baseline.to_dict(),
            "winner": None if win is None else win.name,
            "margin": self.margin,
            "seq": self.seq,
            "global_batch": self.global_batch,
            "target": self.target,
            "devices": self.devices,
            "compiles": self.compiles,
            "seconds": self.seconds,
        }


def fastest(
    workload: Workload,
    policies: Iterable[PolicyLike] = ("none", "full", "minimal", PLAN),
    schedule: Any = "none",
    *,
    global_batch: int | None = None,
    accumulate: Callable[[int], Workload] | None = None,
    headroom: float = DEFAULT_HEADROOM,
    limit_bytes: int | None = None,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    progress: Callable[[str], None] | None = None,
    executor: Executor | None = None,
    workload_for: Callable[[], Workload] | None = None,
) -> Fastest:
    """Which policy and micro-batch train the step fastest on the workload's GPU.

    For each policy: the largest micro-batch that fits (:func:`max_batch`, compiled on both
    sides of the boundary), then the candidates, each compiled and timed from its program:

    - without ``global_batch``: the largest micro-batch and the largest power of two under it
      (products tile better on powers of two); the optimizer steps once per micro-batch;
    - with ``global_batch``: the two smallest accumulation counts whose accumulating step
      fits (a count divides the global batch over the data-parallel GPUs; the optimizer
      updates once per ``global_batch``), compiled fewest first: where the accumulator puts
      a count over the limit, the next count's smaller micro-batch is compiled.

    ``plan`` stands for the planner: at each candidate micro-batch (those of ``full``, the
    most frugal policy), the plan with the least predicted time that fits (:func:`plan`).

    ``none`` is always searched (as the baseline, at its own largest batch), whether or not it
    is among ``policies``.

    Args:
      workload: the step, without gradient accumulation when ``global_batch`` is given.
      policies: policy names/specs/Policies, and ``"plan"`` for the planner.
      schedule: the layer schedule of every catalogue policy.
      global_batch: sequences per optimizer step to reach (None: each policy at its own
        best micro-batch, no accumulation).
      accumulate: ``accum -> Workload`` of the same step accumulating over ``accum``
        micro-batches; needed with ``global_batch``.
      headroom: fraction of device memory left free; ``limit_bytes`` an explicit limit.
      offload, hide: as for :func:`plan`.
      progress: called with a few words before each policy's search (for a progress bar).
      executor: where the catalogue policies (and the ``none`` baseline) are searched side by
        side, a ``concurrent.futures.Executor`` (a Dask cluster's); they do not depend on
        each other, the planner's row (which plans at their micro-batches) follows here.
        The first runs here (see ``remat_kit._workers.run``); each rebuilds the step with
        ``workload_for``, and the cache entries the workers write are stored here.
      workload_for: ``() -> Workload``, the same step as ``workload``; needed with
        ``executor``, and it (and ``accumulate``) must pickle.

    Returns:
      A :class:`Fastest`.

    Raises:
      BadValue: no policies; ``global_batch`` without ``accumulate``, below 1 or not a
        multiple of the data-parallel GPUs; a workload that already accumulates;
        ``executor`` without ``workload_for``.

    Example:
      >>> f = rk.search.fastest(w, ["full"], limit_bytes=2**20)
      >>> row = f.rows[0]
      >>> row.micro_batch <= row.max_batch, row.step_seconds > 0, f.baseline.policy
      (True, True, 'none')
    """
    t0 = time.perf_counter()
    before = workload.compiles
    specs = [PLAN if p == PLAN else as_policy(p) for p in policies]
    if not specs:
        raise BadValue("fastest needs at least one policy", param="policies")
    sch = parse_schedule(schedule)
    ways = max(1, int(workload.batch_multiple))
    if global_batch is not None:
        _check_global(global_batch, ways, accumulate)
    limit = (
        limit_for(workload.target, limit_bytes, headroom) if limit_bytes is None else limit_bytes
    )
    search = _Search(workload, sch, limit, headroom, offload, hide, global_batch, accumulate)
    # The catalogue first: the planner then also plans at the micro-batches they chose.
    order = sorted(range(len(specs)), key=lambda i: specs[i] == PLAN)
    found: dict[int, Throughput] = {}
    remote = 0  # programs compiled for rows searched by the executor's items
    base = None
    if executor is not None:
        if workload_for is None:
            raise BadValue(
                "fastest(executor=...) rebuilds the step in each worker: give workload_for",
                param="workload_for",
            )
        catalogue = [i for i in order if specs[i] != PLAN]
        asked = [specs[i].spec for i in catalogue]
        with_base = "none" not in asked
        one = functools.partial(
            _policy_row,
            workload_for,
            accumulate,
            sch.spec,
            limit,
            (headroom, offload, hide, global_batch),
        )

        def done(j: int, out: tuple[Throughput, int]) -> None:
            if progress is not None:
                progress(f"{out[0].policy} done")

        rows_out = _workers.run(
            one, [*asked, "none"] if with_base else asked, 1, on_done=done, executor=executor
        )
        remote = sum(c for _, c in rows_out)
        for i, (row, _) in zip(catalogue, rows_out, strict=False):
            found[i] = row
        if with_base:
            base = rows_out[-1][0]
        order = [i for i in order if specs[i] == PLAN]
    for n, i in enumerate(order):
        p = specs[i]
        if progress is not None:
            progress(f"{PLAN if p == PLAN else p.spec} ({n + 1}/{len(specs)})")
        if p == PLAN:
            rows_so_far = [r for r in found.values() if r.fits]
            hints = [(r.micro_batch, r.accum) for r in rows_so_far]
            row = search.planned(hints, [q for q in specs if q != PLAN])
            twin = next(
                (
                    r
                    for r in rows_so_far
                    if row.program is not None
                    and (r.program, r.micro_batch, r.accum)
                    == (row.program, row.micro_batch, row.accum)
                ),
                None,
            )
            found[i] = row if twin is None else dataclasses.replace(row, same_as=twin.name)
        else:
            found[i] = search.policy(p)
    rows = [found[i] for i in range(len(specs))]
    base = base or next(
        (r for r, p in zip(rows, specs, strict=True) if p != PLAN and p.spec == "none"), None
    )
    if base is None:
        if progress is not None:
            progress("none (the baseline)")
        base = search.policy(NO_REMAT)
    return Fastest(
        rows=tuple(rows),
        baseline=base if base.fits else None,
        seq=workload.seq,
        global_batch=global_batch,
        target=workload.target.name,
        devices=workload.target.devices,
        compiles=workload.compiles - before + search.extra_compiles() + remote,
        seconds=time.perf_counter() - t0,
    )


def _policy_row(
    workload_for: Callable[[], Workload],
    accumulate: Callable[[int], Workload] | None,
    schedule: str,
    limit: int,
    options: tuple[float, bool, float, int | None],
    policy: str,
) -> tuple[Throughput, int]:
    """One catalogue policy's row and the programs it compiled, in a fresh search of the
    step ``workload_for`` builds (module-level, so a worker process can run it)."""
    headroom, offload, hide, global_batch = options
    w = workload_for()
    search = _Search(
        w, parse_schedule(schedule), limit, headroom, offload, hide, global_batch, accumulate
    )
    row = search.policy(as_policy(policy))
    return row, w.compiles + search.extra_compiles()


def _check_global(global_batch: int, ways: int, accumulate: Any) -> None:
    if accumulate is None:
        raise BadValue(
            "a global batch needs accumulate (accum -> Workload) to build the accumulating step",
            param="accumulate",
        )
    if ways > 1 and global_batch % ways:
        raise BadValue(
            f"global batch {global_batch} does not split over {ways} data-parallel GPUs; "
            f"use a multiple of {ways}",
            param="global_batch",
        )
    if global_batch < 1:
        raise BadValue(f"global batch {global_batch} must be at least 1", param="global_batch")


@dataclasses.dataclass
class _Search:
    """One search's shared state: the workload, the limit, the accumulating workloads."""

    workload: Workload
    schedule: Schedule
    limit: int
    headroom: float
    offload: bool
    hide: float
    global_batch: int | None
    accumulate: Callable[[int], Workload] | None
    _accum: dict[int, Workload] = dataclasses.field(default_factory=dict)

    def extra_compiles(self) -> int:
        return sum(w.compiles for a, w in self._accum.items() if a > 1)

    def at(self, accum: int) -> Workload:
        """The workload accumulating over ``accum`` micro-batches (``accum`` 1: the given)."""
        if accum == 1 or self.accumulate is None:
            return self.workload
        if accum not in self._accum:
            self._accum[accum] = self.accumulate(accum)
        return self._accum[accum]

    def candidates(self, largest: int) -> list[tuple[int, int]]:
        """``(micro_batch, accum)`` pairs to compile, in order, given the largest micro-batch
        that fits: the first two whose compiled step fits are the candidates (:func:`_rows`).

        With a global batch these are every accumulation count whose micro-batch fits alone,
        fewest first: the accumulator may put a count's step over the limit, and the next
        count's smaller micro-batch may then fit."""
        ways = max(1, int(self.workload.batch_multiple))
        if self.global_batch is None:
            pow2 = 1 << (largest.bit_length() - 1)
            pow2 -= pow2 % ways
            return [(b, 1) for b in dict.fromkeys((largest, pow2)) if b >= ways]
        per_gpu = self.global_batch // ways
        counts = [a for a in range(1, per_gpu + 1) if per_gpu % a == 0]
        return [(self.global_batch // a, a) for a in counts if self.global_batch // a <= largest]

    def policy(self, pol: Policy) -> Throughput:
        fit = max_batch(self.workload, pol, self.schedule, limit_bytes=self.limit)
        name = label(pol.spec, self.schedule.spec)
        if not fit.fits:
            return self._none_fits(pol.spec, name, fit.peak_bytes, fit.note)

        def row_of(micro: int, accum: int) -> Throughput | None:
            w = self.at(accum)
            r = w.compiled(pol, self.schedule, micro * accum)
            if r.peak_bytes > self.limit:
                return None
            row = self._row(pol.spec, self.schedule.spec, name, micro, accum, fit.batch, r)
            return dataclasses.replace(
                row, recompute_overhead=w.recompute_of(pol, self.schedule, micro * accum)
            )

        best, tried = _rows(self.candidates(fit.batch), row_of, enough=2)
        if best is None:
            return self._none_fits(pol.spec, name, fit.peak_bytes, fit.note, largest=fit.batch)
        return dataclasses.replace(best, tried=tuple(tried))

    def planned(self, hints: list[tuple[int, int]], catalogue: list[Any]) -> Throughput:
        """The planner's row: the fastest plan at each candidate micro-batch of ``full`` (the
        most frugal policy reaches the largest) and at each of ``hints`` (the micro-batches
        the catalogue policies chose), with those policies as the planner's extras, so the
        plan is never slower than a catalogue policy at the same micro-batch."""
        fit = max_batch(self.workload, FULL, self.schedule, limit_bytes=self.limit)
        if not fit.fits:
            return self._none_fits(PLAN, PLAN, fit.peak_bytes, fit.note)

        def row_of(micro: int, accum: int) -> Throughput | None:
            p = plan(
                self.at(accum),
                micro * accum,
                self.limit,
                offload=self.offload,
                hide=self.hide,
                extra=[(q, self.schedule) for q in catalogue],
            )
            if not p.fits or p.report is None:
                return None
            row = self._row(
                p.policy.spec,
                p.schedule.spec,
                f"plan: {p.label}",
                micro,
                accum,
                fit.batch,
                p.report,
            )
            return dataclasses.replace(row, recompute_overhead=p.recompute_overhead)

        best, tried = _rows(self.candidates(fit.batch), row_of, enough=2)
        done = {(micro, accum) for micro, accum, _ in tried}
        rest = [h for h in dict.fromkeys(hints) if h not in done]
        also, more = _rows(rest, row_of, enough=len(rest))
        tried += more
        if also is not None and (best is None or _faster(also, best)):
            best = also
        if best is None:
            return self._none_fits(PLAN, PLAN, fit.peak_bytes, fit.note, largest=fit.batch)
        return dataclasses.replace(best, tried=tuple(tried))

    def _row(
        self, spec: str, sched: str, name: str, micro: int, accum: int, largest: int, report: Any
    ) -> Throughput:
        batch = micro * accum
        st = report.step_time
        seconds = None if st is None else st.seconds
        return Throughput(
            policy=spec,
            schedule=sched,
            name=name,
            batch=batch,
            micro_batch=micro,
            accum=accum,
            max_batch=largest,
            peak_bytes=report.peak_bytes,
            limit_bytes=self.limit,
            step_seconds=seconds,
            tokens_per_second=None
            if st is None
            else st.tokens_per_second(self.workload.tokens(batch)),
            mfu=None if st is None else st.mfu,
            recompute_overhead=None,
            program=report.meta.program,
        )

    def _none_fits(
        self, spec: str, name: str, peak: int, note: Note | None, largest: int = 0
    ) -> Throughput:
        return Throughput(
            policy=spec,
            schedule=self.schedule.spec,
            name=name,
            batch=0,
            micro_batch=0,
            accum=0,
            max_batch=largest,
            peak_bytes=peak,
            limit_bytes=self.limit,
            step_seconds=None,
            tokens_per_second=None,
            mfu=None,
            recompute_overhead=None,
            note=note,
        )


def _rows(
    pairs: Iterable[tuple[int, int]],
    row_of: Callable[[int, int], Throughput | None],
    enough: int,
) -> tuple[Throughput | None, list[tuple[int, int, float | None]]]:
    """The fastest row of ``pairs`` (``(micro_batch, accum)``), compiled in order until
    ``enough`` of them fit (``row_of`` gives None for one over the limit), and what was
    tried: ``(micro, accum, tokens/s or None)``."""
    tried: list[tuple[int, int, float | None]] = []
    best, fitted = None, 0
    for micro, accum in pairs:
        if fitted == enough:
            break
        row = row_of(micro, accum)
        if row is None:
            tried.append((micro, accum, None))  # over the limit (the accumulator, most often)
            continue
        fitted += 1
        tried.append((micro, accum, row.tokens_per_second))
        if best is None or _faster(row, best):
            best = row
    return best, tried


def _faster(row: Throughput, best: Throughput) -> bool:
    if row.tokens_per_second is None:
        return False
    return best.tokens_per_second is None or row.tokens_per_second > best.tokens_per_second
