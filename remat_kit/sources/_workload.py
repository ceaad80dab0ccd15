"""The Workload: a training step the search may compile or trace for any policy and batch.

A :class:`Workload` is the cached view of (source, target, train config): the step compiled
or traced (FLOPs, residuals, the fixed parts' bytes) for a policy, a layer schedule and a
batch size, on the target. It caches every answer, so a plan, a max-batch search and a Pareto
front over the same workload share their compiles. There is one door,
:func:`~remat_kit.sources.workload`: a model source, or a :class:`Measured` step (hand-made
callbacks, the adapter for figures remat_kit does not make); what either answers is asked in
one place (:meth:`Measured.answers`, ``sources._steps.answers_of``).

Its public methods take what users write (a policy name, a Policy, a jax callable) and
normalise it once; the typed ones (:meth:`Workload.compiled`, :meth:`Workload.traced_flops`,
:meth:`Workload.traced_residuals`) take the ``Policy`` and ``Schedule`` objects the rest of
:mod:`remat_kit.search` already holds.

Example:
  >>> w = rk.sources.workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16))
  >>> w.report("full", batch=2) is w.report("full", batch=2), w.compiles
  (True, 1)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Any

from remat_kit.analysis import MemoryReport
from remat_kit.errors import BadType, BadValue
from remat_kit.flops import FlopCount
from remat_kit.policies import FULL, NO_REMAT, Policy, PolicyLike, as_policy
from remat_kit.residuals import ResidualReport
from remat_kit.schedules import NO_SCHEDULE, Schedule, parse_schedule
from remat_kit.sources._depth import check_depth, extrapolated
from remat_kit.sources._measured import Answers, Measured
from remat_kit.sources._protocol import StepSource
from remat_kit.sources._spread import Spread, compile_in_worker
from remat_kit.sources._steps import answers_of
from remat_kit.targets import Target
from remat_kit.train import TrainConfig

__all__ = [
    "DEFAULT_HIDE",
    "OBJECTIVES",
    "Workload",
]

#: What a search minimises: ``time``, the step's predicted time (recomputed products,
#: attention and elementwise work each at the target's rate, :mod:`remat_kit.timing._traced`;
#: a compiled plan's from its kernels, :mod:`remat_kit.timing`); ``flops``, extra FLOPs as if
#: all ran at peak (what remat_kit used before it predicted time). Host transfers beyond what
#: hides behind compute count in both.
OBJECTIVES = ("time", "flops")

#: Fraction of the step's compute time (at peak bf16 throughput) that host transfers may take
#: and still count as hidden behind compute. Device->host copies overlap the forward pass and
#: host->device copies the backward pass, and both share HBM bandwidth with the kernels, so
#: only part of the step is usable; half is the default.
DEFAULT_HIDE = 0.5


#: The kinds of layer schedule (``Workload.schedule_kinds`` names a subset).
SCHEDULE_KINDS = ("none", "every", "sqrt", "nested", "layers")

#: What no policy removes, as named in a breakdown.
FIXED_PARTS = ("weights", "gradients", "optimizer", "batch", "grad_accumulator")


@dataclasses.dataclass
class _Caches:
    """Every answer of one (source, target, config) at one sequence, shared by its batch
    views: compiled reports and traces by (policy, schedule, batch), the full-depth
    verifications, the searches' scratch (:attr:`Workload.memo`), what compiles now."""

    reports: dict[Hashable, MemoryReport] = dataclasses.field(default_factory=dict)
    flops: dict[Hashable, FlopCount] = dataclasses.field(default_factory=dict)
    residuals: dict[Hashable, ResidualReport] = dataclasses.field(default_factory=dict)
    memo: dict[Hashable, Any] = dataclasses.field(default_factory=dict)
    verified: set[Hashable] = dataclasses.field(default_factory=set)
    now: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """A training step the search may compile for any policy, schedule and batch size.

    The cached view of (source, target, train config), made by
    :func:`~remat_kit.sources.workload`, the one door: from a model source, or from a
    :class:`Measured` step (callbacks). Every answer is cached in this object, keyed by
    (policy spec, schedule, batch), so searches over the same workload share compiles and
    traces. Made by hand, it refuses what the door would.

    Attributes:
      source: the step: a model source (``rk.sources.StepSource``) or a :class:`Measured` one.
      target: where the step compiles.
      config: sequence, optimizer, precision, accumulation; its ``batch`` is the one
        :meth:`report`, :meth:`flops`, :meth:`residuals` and :meth:`recompute_overhead` use
        where none is given (:meth:`at` gives the same step at another).
      strict: a policy matching no tag is an error (the CLI), not a warning.
      depth: how an unrolled model is compiled (``rk.sources.measure``): with ``auto``,
        probes are read off shallow copies and final answers compiled whole.
      label: a name for tables; None: the source's own (set at construction).
      spread: where programs a search needs at once (:meth:`compile_all`) may compile
        besides this process: local workers or a cluster (None: here, one by one).
      residual_ways: devices one step's traced residuals split over where the source's
        batch cannot (a sharded step of your own, whose shapes are fixed: ``rk.auto``); the
        planner then sizes one device's share.

    Example:
      >>> w = rk.sources.workload(tiny_model, "h100", rk.TrainConfig(batch=2, seq=16))
      >>> w.report("full", batch=2).policy, w.compiles
      ('full', 1)
      >>> w.recompute_overhead("full", batch=2) > 0
      True
    """

    source: StepSource | Measured
    target: Target
    config: TrainConfig
    strict: bool = False
    depth: str = "auto"
    label: str | None = None
    spread: Spread | None = None
    residual_ways: int = 1
    _answers: Answers = dataclasses.field(init=False, repr=False)
    _named: bool = dataclasses.field(init=False, repr=False)
    _cache: _Caches = dataclasses.field(default_factory=_Caches, init=False, repr=False)
    # The workloads of one (source, target, config) by sequence, shared by every one of
    # them and by their batch views: at(seq=) builds each sequence once.
    _family: dict[int, Workload] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.target, Target) or not isinstance(self.config, TrainConfig):
            raise BadType(
                f"a Workload takes a Target and a TrainConfig, got {type(self.target).__name__} "
                f"and {type(self.config).__name__}: make it with rk.sources.workload",
                param="target" if not isinstance(self.target, Target) else "config",
            )
        check_depth(self.depth)
        ways = self.residual_ways
        if isinstance(ways, bool) or not isinstance(ways, int) or ways < 1:
            raise BadValue(f"residual_ways={ways!r} must be a positive int", param="residual_ways")
        if isinstance(self.source, Measured):
            answers = self.source.answers(self.config.accum)
        else:
            self.source.check(self.config, self.target)
            answers = answers_of(
                self.source, self.target, self.config, strict=self.strict, depth=self.depth
            )
        object.__setattr__(self, "_answers", answers)
        object.__setattr__(self, "_named", self.label is not None)
        if self.label is None:
            object.__setattr__(self, "label", answers.label)
        self._family[self.seq] = self

    @property
    def seq(self) -> int:
        """Tokens per sequence (tokens per step = batch x seq)."""
        return self.config.seq

    @property
    def batch(self) -> int:
        """The batch this view's methods use where none is given (the config's)."""
        return self.config.batch

    @property
    def n_layers(self) -> int:
        """Layers of the stack (the granularity of layer schedules a plan may use)."""
        return self._answers.n_layers

    @property
    def batch_multiple(self) -> int:
        """Batch sizes must be multiples of this (accumulation steps x data-parallel ways)."""
        return self._answers.batch_multiple

    @property
    def schedule_kinds(self) -> frozenset[str] | None:
        """The schedule kinds (``none``, ``every``, ``sqrt``, ``nested``, ``layers``) the
        source can build; None: all. A factory's model may take none: the search then leaves
        schedules out."""
        return self._answers.schedule_kinds

    @property
    def remat_always(self) -> bool:
        """The model's own trainer checkpoints every layer (MaxText): ``none`` is compiled as
        the baseline figures are read against, never given as a plan."""
        return self._answers.remat_always

    @property
    def plannable(self) -> bool:
        """Whether the step's residuals can be traced (what ``rk.plan`` needs)."""
        return self._answers.residuals is not None

    @property
    def shapes_known(self) -> bool:
        """Whether the fixed parts (weights, gradients, optimizer...) come from shapes,
        without a compile: what lets a budget below them be refused at once."""
        return self._answers.breakdown is not None

    @property
    def estimates(self) -> bool:
        """Whether a compiled probe may be an estimate read off shallow copies of an unrolled
        model, to be compiled whole for a final answer (:meth:`verified`, :meth:`whole`)."""
        return self._answers.verify is not None

    def at(self, *, batch: int | None = None, seq: int | None = None) -> Workload:
        """The same step at another batch or sequence: what the searches probe.

        ``batch`` gives a view that shares this workload's caches (a batch is a parameter of
        every compile, not a new program); ``seq`` the workload of the same source, target
        and config at that sequence (a new program: its own caches), built once and shared
        by every workload of the family. The batch carries over unless given.

        Args:
          batch: sequences per step (a multiple of :attr:`batch_multiple`); None: this one's.
          seq: tokens per sequence; None: this one's.

        Returns:
          The workload (``self`` where nothing changes).

        Raises:
          BadType: a size that is not an int.
          BadValue: a size below 1, a batch that does not split into ``batch_multiple``, a
            sequence for a Measured step without ``resize``, or one the source refuses (its own
            error, e.g. past a model's learned positions).

        Example:
          >>> w.at(seq=32).seq, w.at(seq=32) is w.at(seq=32), w.at(seq=16) is w
          (32, True, True)
          >>> w.at(batch=4).report("full") is w.report("full", batch=4)
          True
        """
        w = self
        if seq is not None and _size("seq", seq) != self.seq:
            w = self._family.get(seq) or self._resized(seq)
        want = self.batch if batch is None else _size("batch", batch)
        if batch is not None and want % w.batch_multiple:
            raise BadValue(
                f"batch={want} does not split into the step's {w.batch_multiple} "
                "(gradient-accumulation steps x data-parallel devices); use a multiple of "
                f"{w.batch_multiple}",
                param="batch",
            )
        base = self._family[w.seq]  # the family's own at this sequence, not a view
        if want == base.batch:
            return base
        if want == w.batch:
            return w
        view = copy.copy(base)  # shallow: the caches and the family are the same objects
        object.__setattr__(view, "config", dataclasses.replace(base.config, batch=want))
        return view

    @property
    def family(self) -> tuple[Workload, ...]:
        """The workloads of this source, target and config built so far, by sequence (this
        one's and those :meth:`at` built): what a sequence search compiled, in all.

        Example:
          >>> [x.seq for x in w.at(seq=32).family]
          [16, 32]
        """
        return tuple(self._family[s] for s in sorted(self._family))

    def _resized(self, seq: int) -> Workload:
        """The family's workload at ``seq``: the same source, target and options (see
        :meth:`at`)."""
        if not self._answers.resizes:
            raise BadValue(
                f"seq={seq}: this workload's figures are for seq={self.seq} only (a Measured "
                "step without resize); give it a resize, or make one per sequence",
                param="seq",
            )
        base = self._family[self.seq]  # the family's own: its config's batch, not a view's
        source = base.source
        if isinstance(source, Measured):
            source = source.resize(seq)  # type: ignore[misc]
            if not isinstance(source, Measured):
                raise BadType(
                    f"resize({seq}) gave {type(source).__name__}, not a Measured step",
                    param="resize",
                )
        w = dataclasses.replace(
            base,
            source=source,
            config=dataclasses.replace(base.config, seq=seq),
            label=base.label if base._named else None,
        )
        object.__setattr__(w, "_family", self._family)
        self._family[seq] = w
        return w

    def tokens(self, batch: int) -> int:
        """Tokens one step trains at ``batch``: its sequences x ``seq`` (a source's own
        gradient accumulation may train more sequences than the batch).

        Example:
          >>> w.tokens(2)
          32
        """
        count = self._answers.sequences
        sequences = batch if count is None else count(batch)
        return int(sequences) * self.seq

    def report(
        self, policy: PolicyLike, schedule: Any = "none", batch: int | None = None
    ) -> MemoryReport:
        """The compiled report of the step (cached); ``batch`` None: :attr:`batch`."""
        return self.compiled(as_policy(policy), parse_schedule(schedule), self._batch(batch))

    def flops(self, policy: PolicyLike, schedule: Any = "none", batch: int | None = None) -> float:
        """FLOPs of the step, recomputation included (traced, cached)."""
        return self.traced_flops(as_policy(policy), parse_schedule(schedule), self._batch(batch))

    def baseline(self, batch: int) -> float:
        """FLOPs of the step without rematerialization."""
        return self.traced_flops(NO_REMAT, NO_SCHEDULE, batch)

    def recompute_overhead(
        self, policy: PolicyLike, schedule: Any = "none", batch: int | None = None
    ) -> float:
        """Extra FLOPs of recomputation, as a fraction of the step without remat."""
        return self.recompute_of(as_policy(policy), parse_schedule(schedule), self._batch(batch))

    def residuals(
        self, policy: PolicyLike, schedule: Any = "none", batch: int | None = None
    ) -> ResidualReport:
        """What the policy keeps for the backward pass, by tag (traced, cached).

        Raises:
          BadValue: the workload has no residuals (:attr:`plannable`).
        """
        return self.traced_residuals(
            as_policy(policy), parse_schedule(schedule), self._batch(batch)
        )

    def _batch(self, batch: int | None) -> int:
        return self.batch if batch is None else _size("batch", batch)

    def breakdown(self, batch: int) -> dict[str, int]:
        """Bytes of weights/gradients/optimizer/batch/accumulator (shapes; or one compile)."""
        key = ("breakdown", batch)
        if key not in self._cache.memo:
            if self.shapes_known:
                parts = dict(self._answers.breakdown(batch))
            else:
                parts = dict(self.compiled(FULL, NO_SCHEDULE, batch).breakdown)
            self._cache.memo[key] = {k: int(v) for k, v in parts.items() if k != "activations"}
        return dict(self._cache.memo[key])

    def supports(self, schedule: Any) -> bool:
        """Whether the source can build ``schedule`` (see :attr:`schedule_kinds`).

        Args:
          schedule: a Schedule, a spec (``"every:2"``) or a bare kind (``"layers"``).
        """
        kinds = self.schedule_kinds
        if kinds is None:
            return True
        name = schedule if schedule in SCHEDULE_KINDS else parse_schedule(schedule).name
        return name in kinds

    def fixed_bytes(self, batch: int) -> int:
        """Bytes no policy removes: weights, gradients, optimizer state, batch, accumulator."""
        parts = self.breakdown(batch)
        return sum(parts.get(k, 0) for k in FIXED_PARTS)

    @property
    def compiles(self) -> int:
        """Number of programs compiled so far (full-depth verifications included)."""
        return len(self._cache.reports) + len(self._cache.verified)

    @property
    def compiling(self) -> tuple[str, str, int] | None:
        """The (policy spec, schedule spec, batch) this process is compiling for the
        workload now, or None: what a progress line names while a search waits on it.

        Example:
          >>> w.compiling is None  # between compiles
          True
        """
        return self._cache.now[-1] if self._cache.now else None

    @contextlib.contextmanager
    def _compiling(self, pol: Policy, sch: Schedule, batch: int) -> Iterator[None]:
        self._cache.now.append((pol.spec, sch.spec, int(batch)))
        try:
            yield
        finally:
            self._cache.now.pop()

    def step_seconds(self, batch: int, objective: str = "time") -> float | None:
        """The compute time of the step without remat (an estimate from its trace).

        Args:
          batch: the batch size.
          objective: ``time``: each kind of FLOP at the target's rate
            (:func:`remat_kit.timing._traced.traced_seconds`); ``flops``: all FLOPs at the peak
            bf16 rate. A target without the rates (the CPU, a custom GPU naming none) falls
            back to the peak, and without that to None.
        """
        if objective == "time":
            seconds = self.traced_seconds(NO_REMAT, NO_SCHEDULE, batch)
            if seconds is not None:
                return seconds
        if not self.target.peak_bf16_flops:
            return None
        return self.baseline(batch) / self.target.peak_bf16_flops

    def overhead_of(
        self,
        report: MemoryReport,
        batch: int,
        hide: float = DEFAULT_HIDE,
        objective: str = "time",
    ) -> float:
        """Estimated step-time overhead of a compiled report against the step without remat.

        ``time``, where the report has a predicted step time (:mod:`remat_kit.timing`): its
        predicted seconds over those of the compiled ``none`` step, less one. It can be
        negative: a residual saved is written in the forward pass and read in the backward,
        and recomputing it can cost less than that traffic (measured on an H100: gpt2-medium's
        ``minimal`` step 20% faster than ``none``). Otherwise (and for ``flops``): recompute is
        the extra FLOPs against the step without remat; offloaded bytes cross the host link
        twice (out in the forward pass, back in the backward pass), and the part of that
        transfer time beyond ``hide`` x the step's compute time cannot hide behind compute and
        is added, as a fraction of the step's compute time.
        """
        if objective == "time" and report.step_time is not None:
            reference = self.reference_seconds(batch)
            if reference:
                return report.step_time.seconds / reference - 1.0
        flops = (
            report.flops
            if math.isfinite(report.flops)
            else self.flops(report.policy or "none", report.schedule or "none", batch)
        )
        recompute = flops / self.baseline(batch) - 1.0
        return recompute + self._exposed_fraction(host_bytes(report), batch, hide, objective)

    def reference_seconds(self, batch: int) -> float | None:
        """The predicted step time of the compiled ``none`` step (compiled if it was not; the
        reference of the ``time`` objective); None where the target has no rates."""
        report = self.compiled(NO_REMAT, NO_SCHEDULE, batch)
        return report.step_time.seconds if report.step_time is not None else None

    def transfer_seconds(self, host_bytes: int) -> float | None:
        """Seconds to move ``host_bytes`` to host and back over the target's host link."""
        if not host_bytes:
            return 0.0
        if not self.target.host_link_bandwidth:
            return None
        return 2.0 * host_bytes / self.target.host_link_bandwidth

    # The search's own entry: Policy and Schedule objects, never normalised again.

    @property
    def memo(self) -> dict[Hashable, Any]:
        """Scratch space the searches keep with the workload (cost models, the planner's
        corrections), so later searches over the same workload start from them."""
        return self._cache.memo

    def trace_caches(self) -> tuple[dict[Hashable, FlopCount], dict[Hashable, ResidualReport]]:
        """The traced FLOPs and residuals by (policy, schedule, batch): the live dicts, so
        workloads whose steps trace alike (the same model on other GPUs) can share them."""
        return self._cache.flops, self._cache.residuals

    def adopt_traces(
        self, flops: Mapping[Hashable, FlopCount], residuals: Mapping[Hashable, ResidualReport]
    ) -> None:
        """Takes traced FLOPs and residuals of a workload whose steps trace the same
        (:meth:`trace_caches`); what this one traced already is kept."""
        for k, v in flops.items():
            self._cache.flops.setdefault(k, v)
        for k, v in residuals.items():
            self._cache.residuals.setdefault(k, v)

    def compiled(self, pol: Policy, sch: Schedule, batch: int) -> MemoryReport:
        """The compiled report of a typed (policy, schedule, batch) (cached)."""
        key = _key(pol, sch, batch)
        if key not in self._cache.reports:
            with self._compiling(pol, sch, batch):
                self._cache.reports[key] = self._answers.measure(pol, sch, batch)
        return self._cache.reports[key]

    def verified(
        self, pol: Policy, sch: Schedule, batch: int, limit: int | None = None
    ) -> MemoryReport:
        """The compiled report of a typed (policy, schedule, batch) whose verdict against
        ``limit`` bytes (None: whatever it is, the answer is final) is the full step's: a
        report read off shallow copies is replaced by the full-depth compile where
        the source says so (cached in its place: :attr:`estimates`)."""
        key = _key(pol, sch, batch)
        report = self.compiled(pol, sch, batch)
        if self.estimates and key not in self._cache.verified:
            with self._compiling(pol, sch, batch):
                full = self._answers.verify(pol, sch, batch, report, limit)
            if full is not report:
                self._cache.reports[key] = report = full
                self._cache.verified.add(key)
        return report

    def whole(self, pol: Policy, sch: Schedule, batch: int) -> MemoryReport:
        """The full step's compiled report of a typed (policy, schedule, batch), not read off
        shallow copies: the source asked to compile it whole (cached); without one, the
        compiled report."""
        key = _key(pol, sch, batch)
        if not self.estimates or key in self._cache.reports:
            return self.verified(pol, sch, batch)
        with self._compiling(pol, sch, batch):
            self._cache.reports[key] = self._answers.verify(pol, sch, batch, None, None)
        return self._cache.reports[key]

    def has(self, pol: Policy, sch: Schedule, batch: int, *, whole: bool = False) -> bool:
        """Whether the report of a typed (policy, schedule, batch) is compiled already (with
        ``whole``: the full step's, where this workload reads probes off shallow copies)."""
        key = _key(pol, sch, batch)
        if key not in self._cache.reports:
            return False
        if not whole or not self.estimates or key in self._cache.verified:
            return True
        return not extrapolated(self._cache.reports[key])

    def compile_all(
        self,
        keys: Iterable[tuple[Policy, Schedule, int]],
        *,
        whole: bool = False,
        at_once: bool = False,
    ) -> list[MemoryReport]:
        """The compiled reports of several typed (policy, schedule, batch), the ones not
        cached compiled side by side where the workload has a :attr:`spread`.

        They go through :func:`remat_kit._workers.run`: the first here; with ``at_once`` the
        rest go out while it compiles (two slow programs side by side), else once it turned
        out not to be cached. Each worker builds the workload with ``spread.workload_for``
        and its report joins this workload's caches, as if compiled here. A custom policy
        (a jax callable) cannot travel and compiles here.

        Args:
          keys: the (policy, schedule, batch) wanted.
          whole: the full step's reports (:meth:`whole`), where probes are read off shallow
            copies of an unrolled model.
          at_once: send the others out at once (see above).

        Returns:
          The reports, in the order of ``keys``.

        Example:
          >>> from remat_kit.policies import as_policy
          >>> from remat_kit.schedules import NO_SCHEDULE
          >>> keys = [(as_policy(p), NO_SCHEDULE, 2) for p in ("none", "full")]
          >>> [r.policy for r in w.compile_all(keys)]
          ['none', 'full']
        """
        keys = list(keys)

        def here(i: int) -> MemoryReport:
            pol, sch, batch = keys[i]
            return self.whole(pol, sch, batch) if whole else self.compiled(pol, sch, batch)

        missing = [i for i, (p, s, b) in enumerate(keys) if not self.has(p, s, b, whole=whole)]
        spread = self.spread
        if (
            spread is not None
            and spread.side_by_side
            and len(missing) >= 2
            and all(keys[i][0].name != "custom" for i in missing)
        ):
            from remat_kit import _workers

            items = [(keys[i][0].spec, keys[i][1].spec, int(keys[i][2])) for i in missing]
            index = dict(zip(items, missing, strict=True))
            got = _workers.run(
                functools.partial(compile_in_worker, spread.workload_for, whole),
                items,
                spread.jobs,
                executor=spread.executor,
                here=lambda item: here(index[item]),
                at_once=at_once,
            )
            for i, report in zip(missing, got, strict=True):
                self._adopt(*keys[i], report, whole=whole)
        return [here(i) for i in range(len(keys))]

    def _adopt(
        self, pol: Policy, sch: Schedule, batch: int, report: MemoryReport, *, whole: bool
    ) -> None:
        """A report compiled elsewhere (a worker) joins the caches, as :meth:`whole` or
        :meth:`compiled` would have kept it here."""
        key = _key(pol, sch, batch)
        held = self._cache.reports.get(key)
        if held is report or (held is not None and not whole):
            return
        if held is not None and self.estimates and extrapolated(held):
            self._cache.verified.add(key)  # the copies' compile and the whole one: two programs
        elif held is not None:
            return
        self._cache.reports[key] = report

    def traced_flops(self, pol: Policy, sch: Schedule, batch: int) -> float:
        """FLOPs of a typed (policy, schedule, batch), from its compiled report when there is
        one, else traced (cached)."""
        key = _key(pol, sch, batch)
        if key not in self._cache.flops:
            # A compiled report counted the FLOPs of the same step from its own trace.
            compiled = self._cache.reports.get(key)
            if compiled is not None and math.isfinite(compiled.flops):
                return float(compiled.flops)
        return self.traced_count(pol, sch, batch).total

    def traced_count(self, pol: Policy, sch: Schedule, batch: int) -> FlopCount:
        """The FLOPs of a typed (policy, schedule, batch) by kind (traced, cached)."""
        key = _key(pol, sch, batch)
        if key not in self._cache.flops:
            counted = self._answers.flops(pol, sch, batch)
            if not isinstance(counted, FlopCount):
                n = float(counted)  # a bare number: priced as products
                counted = FlopCount(total=n, matmul=n, attention_kernel=0.0, other=0.0)
            self._cache.flops[key] = counted
        return self._cache.flops[key]

    def traced_seconds(self, pol: Policy, sch: Schedule, batch: int) -> float | None:
        """The compute time of a typed (policy, schedule, batch) from its trace, each kind of
        FLOP at the target's rate (:func:`remat_kit.timing._traced.traced_seconds`); None for
        a target without the rates."""
        from remat_kit.timing import traced_seconds

        speed = self.speed
        if speed is None:
            return None
        return traced_seconds(self.traced_count(pol, sch, batch), speed)

    @property
    def speed(self) -> Any:
        """The target's rates (:func:`remat_kit.timing.speed_of`; None: not known)."""
        from remat_kit.timing import speed_of

        if "speed" not in self._cache.memo:
            self._cache.memo["speed"] = speed_of(self.target)
        return self._cache.memo["speed"]

    def recompute_of(self, pol: Policy, sch: Schedule, batch: int) -> float:
        """Extra FLOPs of recomputation of a typed (policy, schedule, batch), as a fraction."""
        return self.traced_flops(pol, sch, batch) / self.baseline(batch) - 1.0

    def traced_residuals(self, pol: Policy, sch: Schedule, batch: int) -> ResidualReport:
        """What a typed (policy, schedule) keeps for the backward pass (traced, cached).

        Raises:
          BadValue: the workload has no residuals (:attr:`plannable`).
        """
        if not self.plannable:
            raise BadValue(
                "this Workload has no residuals (a Measured step without residuals_fn); "
                "rk.plan needs residual sizes",
                param="residuals_fn",
            )
        key = _key(pol, sch, batch)
        if key not in self._cache.residuals:
            traced = self._answers.residuals(pol, sch, batch)  # type: ignore[misc]
            self._cache.residuals[key] = _share(traced, self.residual_ways)
        return self._cache.residuals[key]

    def _exposed_fraction(
        self, host_bytes: int, batch: int, hide: float, objective: str = "time"
    ) -> float:
        transfer = self.transfer_seconds(host_bytes)
        step = self.step_seconds(batch, objective)
        if not host_bytes:
            return 0.0
        if transfer is None or step is None:
            return math.inf  # a target without a host link figure: offload cannot be costed
        return max(0.0, transfer - hide * step) / step


def _size(name: str, value: Any) -> int:
    """A batch or sequence, checked once at the public edge."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(f"{name} must be an int, got {value!r}", param=name)
    if value < 1:
        raise BadValue(f"{name}={value} must be at least 1", param=name)
    return value


def _share(r: ResidualReport, ways: int) -> ResidualReport:
    """``r``'s bytes one device's share: traced residuals are the whole batch's, a device
    keeps ``1 / ways`` of them (the planner's model only: every plan is compiled sharded)."""
    if ways <= 1:
        return r
    kept = tuple(dataclasses.replace(x, nbytes=-(-x.nbytes // ways)) for x in r.residuals)
    return dataclasses.replace(
        r,
        residuals=kept,
        tag_bytes={k: -(-v // ways) for k, v in r.tag_bytes.items()},
        segment_offloaded_bytes=-(-r.segment_offloaded_bytes // ways),
    )


def _key(pol: Policy, sch: Schedule, batch: int) -> Hashable:
    p = (pol.spec, id(pol.jax_policy)) if pol.name == "custom" else pol.spec
    return (p, sch, int(batch))


def host_bytes(report: MemoryReport) -> int:
    """Bytes a compiled report keeps in host memory (offloaded)."""
    return int(report.host_temp_bytes or report.host_bytes or 0)
