"""Measured: a step measured by hand, a source of its own for the one door.

Where the figures come from somewhere other than a model remat_kit builds (a formula in a
test, a simulator, another tool's compiles), a :class:`Measured` step's callbacks stand in for
the model source: ``rk.sources.workload(Measured(...), target, config)`` makes a
:class:`~remat_kit.sources.Workload` as a model source does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from remat_kit.analysis import MemoryReport
from remat_kit.flops import FlopCount
from remat_kit.policies import Policy
from remat_kit.residuals import ResidualReport
from remat_kit.schedules import Schedule

__all__ = ["Answers", "Measured"]

MeasureFn = Callable[[Policy, Schedule, int], MemoryReport]
FlopsFn = Callable[[Policy, Schedule, int], "FlopCount | float"]
ResidualsFn = Callable[[Policy, Schedule, int], ResidualReport]
BreakdownFn = Callable[[int], Mapping[str, int]]
VerifyFn = Callable[[Policy, Schedule, int, MemoryReport, "int | None"], MemoryReport]


@dataclasses.dataclass(frozen=True)
class Measured:
    """A step measured by hand: a source of its own, for :func:`~remat_kit.sources.workload`.

    Where the figures come from somewhere other than a model remat_kit builds (a formula in a
    test, a simulator, another tool's compiles), these callbacks stand in for the model
    source: ``rk.sources.workload(Measured(...), target, config)`` makes the same Workload a
    model source makes, the one way into the search. Each callback takes what the search
    holds, ``(policy, schedule, batch)`` (a Policy, a Schedule, an int), for the workload's
    target and sequence.

    Attributes:
      measure_fn: ``(policy, schedule, batch) -> MemoryReport``, as compiled for the target.
      flops_fn: ``(policy, schedule, batch) -> FlopCount`` (or a bare number of FLOPs) of the
        whole step. The split by kind prices each at its rate for the ``time`` objective; a
        bare number is priced as matrix products.
      residuals_fn: ``(policy, schedule, batch) -> ResidualReport`` of one micro-batch;
        needed by ``rk.plan``.
      breakdown_fn: ``batch -> {"weights", "gradients", "optimizer", "batch",
        "grad_accumulator"}`` bytes; rejects budgets below what no policy can go under.
      verify_fn: ``(policy, schedule, batch, report, limit) -> MemoryReport``: the final
        figure where ``measure_fn``'s is an estimate (see :class:`Workload`); None: every
        report is final.
      n_layers: layers of the stack (the granularity of layer schedules a plan may use).
      schedule_kinds: the schedule names ``measure_fn`` can build; None: all.
      label: a name for tables.
      remat_always: the step's own trainer checkpoints every layer (as MaxText's):
        ``none`` is the baseline figures are read against, never given as a plan.
      batch_ways: devices the batch splits over (data parallelism): a batch is a multiple
        of this times the config's accumulation steps.
      resize: ``seq -> Measured``: the same step measured at another sequence (what
        ``Workload.at(seq=)`` and a sequence search ask for); None: the figures are for the
        config's sequence only.

    Example:
      >>> from remat_kit.sources import Measured, workload
      >>> def measure_fn(policy, schedule, batch):
      ...     step = rk.build_train_step(tiny_model(policy), rk.TrainConfig(batch, 16))
      ...     return rk.memory_report(step.fn, *step.args, target="h100", policy=policy)
      >>> def flops_fn(policy, schedule, batch):
      ...     step = rk.build_train_step(tiny_model(policy), rk.TrainConfig(batch, 16))
      ...     return rk.count_flops(step.fn, *step.args).total
      >>> w = workload(Measured(measure_fn, flops_fn), "h100", rk.TrainConfig(batch=2, seq=16))
      >>> w.report("full", batch=2).policy, w.compiles
      ('full', 1)
      >>> w.recompute_overhead("full", batch=2) > 0
      True
    """

    measure_fn: MeasureFn
    flops_fn: FlopsFn
    residuals_fn: ResidualsFn | None = None
    breakdown_fn: BreakdownFn | None = None
    verify_fn: VerifyFn | None = None
    n_layers: int = 1
    schedule_kinds: frozenset[str] | None = None
    label: str = ""
    remat_always: bool = False
    batch_ways: int = 1
    resize: Callable[[int], Measured] | None = dataclasses.field(default=None, repr=False)

    def answers(self, accum: int) -> Answers:
        """What a Workload asks of this step: its callbacks as they are (a batch is a multiple
        of ``accum``, the gradient-accumulation steps, times :attr:`batch_ways`)."""
        return Answers(
            measure=self.measure_fn,
            flops=self.flops_fn,
            residuals=self.residuals_fn,
            breakdown=self.breakdown_fn,
            verify=self.verify_fn,
            n_layers=self.n_layers,
            batch_multiple=accum * self.batch_ways,
            schedule_kinds=self.schedule_kinds,
            remat_always=self.remat_always,
            label=self.label,
            resizes=self.resize is not None,
        )


@dataclasses.dataclass(frozen=True)
class Answers:
    """What a :class:`~remat_kit.sources.Workload` asks of its step, for its target and
    config, at any batch: made once per workload from its source (``sources._steps``) or
    from a :class:`Measured` step's callbacks, the one place the two differ.

    Attributes:
      measure: ``(policy, schedule, batch) -> MemoryReport``, compiled (a probe of an
        unrolled model may be read off shallow copies: see ``verify``).
      flops: ``(policy, schedule, batch) -> FlopCount | float`` of the whole step, traced.
      residuals: ``(policy, schedule, batch) -> ResidualReport`` of one device's share,
        traced; None: none known (``rk.plan`` cannot plan it).
      breakdown: ``batch -> {part: bytes}`` from shapes; None: read off a compile.
      verify: ``(policy, schedule, batch, report, limit) -> MemoryReport``, the final figure
        where ``measure``'s is an estimate; None: every report is final.
      sequences: ``batch -> sequences`` one step trains; None: the batch.
      n_layers: layers of the stack (the granularity of per-layer schedules).
      batch_multiple: batch sizes are multiples of this.
      schedule_kinds: the schedule kinds ``measure`` can build; None: all.
      remat_always: the model's own trainer checkpoints every layer (MaxText).
      label: the step's name for tables.
      resizes: the same source builds the step at another sequence.
    """

    measure: MeasureFn
    flops: FlopsFn
    residuals: ResidualsFn | None = None
    breakdown: BreakdownFn | None = None
    verify: VerifyFn | None = None
    sequences: Callable[[int], int] | None = None
    n_layers: int = 1
    batch_multiple: int = 1
    schedule_kinds: frozenset[str] | None = None
    remat_always: bool = False
    label: str = ""
    resizes: bool = False
