"""Search over compiled reports: largest batch, cheapest plan under a budget, Pareto front, advice.

Everything here loops over :mod:`remat_kit.analysis`; nothing here knows about model presets. A
:class:`Workload` is the one thing the search needs: callbacks that compile (``measure_fn``) or
trace (``flops_fn``, ``residuals_fn``, ``breakdown_fn``) one training step for a policy, a layer
schedule and a batch size, plus the target it is compiled for. It caches every answer, so a plan,
a max-batch search and a Pareto front over the same workload share their compiles.

The four questions:

- :func:`max_batch`: the largest batch whose compiled peak fits the device minus a headroom
  (exponential search from ``start``, then bisection; every probe is a compiled report).
- :func:`plan`: the plan with the lowest estimated step-time overhead whose *compiled* peak fits
  a budget (the algorithm is in its docstring).
- :func:`front` / :func:`pareto_front`: memory against overhead over catalogue policies, layer
  schedules and plans, with the dominated points marked.
- :func:`advise`: for every GPU target, does the step fit, with which plan, at what overhead,
  and how large a batch the target takes.

Example:
  >>> import remat_kit as rk                                           # doctest: +SKIP
  >>> from models.measure import Options, workload
  >>> w = workload(Options("llama3-8b", batch=4, seq=2048, optimizer="sgd"), "h100")
  >>> p = rk.plan(w, batch=4, budget=rk.parse_budget("52GiB", w.target.memory_bytes))
  >>> p.fits, p.policy.spec, p.schedule.spec
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import time
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from remat_kit.analysis import MemoryReport
from remat_kit.policies import Policy, as_policy
from remat_kit.residuals import ResidualReport
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.schedules import schedule as _make_schedule
from remat_kit.targets import Target, target_names
from remat_kit.targets import target as _target

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_HIDE",
    "FRONT_POLICIES",
    "FRONT_SCHEDULES",
    "Advice",
    "BatchFit",
    "FrontPoint",
    "Plan",
    "PlanCandidate",
    "ScaleOut",
    "Workload",
    "advise",
    "check_budget",
    "front",
    "gpus_needed",
    "max_batch",
    "max_batch_plan",
    "pareto_front",
    "parse_budget",
    "plan",
    "plot_front",
]

#: Fraction of device memory kept free by default. The compiled peak is what XLA's buffer
#: assignment needs; a real process also holds the CUDA context and cuBLAS/cuDNN workspaces
#: (~0.5-1 GiB) and loses some memory to allocator fragmentation, so a program that needs
#: exactly the device's memory runs out. 3% is 2.4 GiB on an 80 GB card. (JAX preallocates
#: only 75% of the device by default: run with ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.97``, or the
#: figures here are not what the process may use.)
DEFAULT_HEADROOM = 0.03

#: Fraction of the step's compute time (at peak bf16 throughput) that host transfers may take
#: and still count as hidden behind compute. Device->host copies overlap the forward pass and
#: host->device copies the backward pass, and both share HBM bandwidth with the kernels, so
#: only part of the step is usable; half is the default.
DEFAULT_HIDE = 0.5

#: Catalogue policies a Pareto front compiles by default (the main ones).
FRONT_POLICIES: tuple[str, ...] = (
    "none",
    "full",
    "block",
    "dots",
    "dots_no_batch",
    "minimal",
    "qkv_proj",
    "context",
    "megatron",
    "offload_dots_no_batch",
    "minimal_offloaded",
)

#: (policy, schedule) pairs a Pareto front compiles by default: segment checkpointing.
FRONT_SCHEDULES: tuple[tuple[str, str], ...] = (
    ("none", "sqrt"),
    ("none", "every:2"),
    ("full", "sqrt"),
    ("minimal", "every:2"),
)

_GIB = 2**30
#: A greedy step whose recompute costs less than this fraction of the step is "free".
_FREE_FLOPS = 1e-4

MeasureFn = Callable[[Policy, Schedule, int], MemoryReport]
FlopsFn = Callable[[Policy, Schedule, int], float]
ResidualsFn = Callable[[Policy, Schedule, int], ResidualReport]
BreakdownFn = Callable[[int], Mapping[str, int]]


# --- the workload -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
    """A training step the search may compile for any policy, schedule and batch size.

    The callbacks hold the model; remat_kit only calls them (``models.measure.workload`` builds
    one from a preset). Every answer is cached in this object, keyed by (policy spec, schedule,
    batch), so searches over the same workload share compiles and traces.

    Attributes:
      measure_fn: ``(policy, schedule, batch) -> MemoryReport`` compiled for ``target``.
      flops_fn: ``(policy, schedule, batch) -> FLOPs`` of the whole step, traced, not compiled.
      target: where ``measure_fn`` compiles.
      seq: tokens per sequence (tokens per step = batch x seq).
      n_layers: layers of the stack (the granularity of layer schedules a plan may use).
      batch_multiple: batch sizes must be multiples of this (gradient accumulation steps).
      residuals_fn: ``(policy, schedule, batch) -> ResidualReport`` of one micro-batch, traced;
        needed by :func:`plan`.
      breakdown_fn: ``batch -> {"weights", "gradients", "optimizer", "batch",
        "grad_accumulator"}`` bytes from shapes, traced; used to reject budgets below what
        no policy can go under.
      label: a name for tables (model, sequence, optimizer).

    Example:
      >>> import remat_kit as rk                                       # doctest: +SKIP
      >>> w = rk.Workload(measure_fn, flops_fn, target=rk.target("h100"), seq=2048)
      >>> w.report("full", "none", 4).peak_bytes
    """

    measure_fn: MeasureFn
    flops_fn: FlopsFn
    target: Target
    seq: int = 1
    n_layers: int = 1
    batch_multiple: int = 1
    residuals_fn: ResidualsFn | None = None
    breakdown_fn: BreakdownFn | None = None
    label: str = ""
    _reports: dict[Hashable, MemoryReport] = dataclasses.field(
        default_factory=dict, init=False, repr=False
    )
    _flops: dict[Hashable, float] = dataclasses.field(default_factory=dict, init=False, repr=False)
    _residuals: dict[Hashable, ResidualReport] = dataclasses.field(
        default_factory=dict, init=False, repr=False
    )
    _memo: dict[Hashable, Any] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def report(self, policy: Any, schedule: Any = "none", batch: int = 1) -> MemoryReport:
        """The compiled report of the step (cached)."""
        pol, sch = as_policy(policy), parse_schedule(schedule)
        key = _key(pol, sch, batch)
        if key not in self._reports:
            self._reports[key] = self.measure_fn(pol, sch, batch)
        return self._reports[key]

    def flops(self, policy: Any, schedule: Any = "none", batch: int = 1) -> float:
        """FLOPs of the step, recomputation included (traced, cached)."""
        pol, sch = as_policy(policy), parse_schedule(schedule)
        key = _key(pol, sch, batch)
        if key not in self._flops:
            self._flops[key] = float(self.flops_fn(pol, sch, batch))
        return self._flops[key]

    def baseline(self, batch: int) -> float:
        """FLOPs of the step without rematerialization."""
        return self.flops("none", "none", batch)

    def recompute_overhead(self, policy: Any, schedule: Any = "none", batch: int = 1) -> float:
        """Extra FLOPs of recomputation, as a fraction of the step without remat."""
        return self.flops(policy, schedule, batch) / self.baseline(batch) - 1.0

    def residuals(self, policy: Any, schedule: Any = "none", batch: int = 1) -> ResidualReport:
        """What the policy keeps for the backward pass, by tag (traced, cached).

        Raises:
          ValueError: the workload has no ``residuals_fn``.
        """
        if self.residuals_fn is None:
            raise ValueError("this Workload has no residuals_fn; rk.plan needs residual sizes")
        pol, sch = as_policy(policy), parse_schedule(schedule)
        key = _key(pol, sch, batch)
        if key not in self._residuals:
            self._residuals[key] = self.residuals_fn(pol, sch, batch)
        return self._residuals[key]

    def breakdown(self, batch: int) -> dict[str, int]:
        """Bytes of weights/gradients/optimizer/batch/accumulator (shapes; or one compile)."""
        key = ("breakdown", batch)
        if key not in self._memo:
            if self.breakdown_fn is not None:
                parts = dict(self.breakdown_fn(batch))
            else:
                parts = dict(self.report("full", "none", batch).breakdown)
            self._memo[key] = {k: int(v) for k, v in parts.items() if k != "activations"}
        return dict(self._memo[key])

    def fixed_bytes(self, batch: int) -> int:
        """Bytes no policy removes: weights, gradients, optimizer state, batch, accumulator."""
        parts = self.breakdown(batch)
        return sum(parts.get(k, 0) for k in _FIXED_PARTS)

    @property
    def compiles(self) -> int:
        """Number of programs compiled so far."""
        return len(self._reports)

    def step_seconds(self, batch: int) -> float | None:
        """The step's compute time at the target's peak bf16 throughput (an estimate)."""
        if not self.target.peak_bf16_flops:
            return None
        return self.baseline(batch) / self.target.peak_bf16_flops

    def overhead_of(self, report: MemoryReport, batch: int, hide: float = DEFAULT_HIDE) -> float:
        """Estimated step-time overhead of a compiled report: recompute plus exposed transfer.

        Recompute is the extra FLOPs against the step without remat. Offloaded bytes cross the
        host link twice (out in the forward pass, back in the backward pass); the part of that
        transfer time beyond ``hide`` x the step's compute time cannot hide behind compute and
        is added, as a fraction of the step's compute time.
        """
        flops = (
            report.flops
            if math.isfinite(report.flops)
            else self.flops(report.policy or "none", report.schedule or "none", batch)
        )
        recompute = flops / self.baseline(batch) - 1.0
        return recompute + self._exposed_fraction(_host_bytes(report), batch, hide)

    def transfer_seconds(self, host_bytes: int) -> float | None:
        """Seconds to move ``host_bytes`` to host and back over the target's host link."""
        if not host_bytes:
            return 0.0
        if not self.target.host_link_bandwidth:
            return None
        return 2.0 * host_bytes / self.target.host_link_bandwidth

    def _exposed_fraction(self, host_bytes: int, batch: int, hide: float) -> float:
        transfer = self.transfer_seconds(host_bytes)
        step = self.step_seconds(batch)
        if not host_bytes:
            return 0.0
        if transfer is None or step is None:
            return math.inf  # a target without a host link figure: offload cannot be costed
        return max(0.0, transfer - hide * step) / step


_FIXED_PARTS = ("weights", "gradients", "optimizer", "batch", "grad_accumulator")


def _key(pol: Policy, sch: Schedule, batch: int) -> Hashable:
    p = (pol.spec, id(pol.jax_policy)) if pol.name == "custom" else pol.spec
    return (p, sch, int(batch))


def _host_bytes(report: MemoryReport) -> int:
    return int(report.host_temp_bytes or report.host_bytes or 0)


# --- budgets ------------------------------------------------------------------------------------

_UNITS = {
    "": None,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "%": None,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*$")


def parse_budget(text: str | float | int, device_bytes: int | None = None) -> int:
    """Reads a memory budget: ``"52GiB"``, ``"40GB"``, ``"0.8"`` or ``"80%"`` (of the device).

    Args:
      text: bytes with a unit (B, KB/MB/GB/TB in powers of 1000; KiB/MiB/GiB/TiB and the
        one-letter K/M/G/T in powers of 1024), a fraction of the device in (0, 1], or a
        percentage. An int is bytes; a float in (0, 1] a fraction.
      device_bytes: the device's memory, needed for fractions and checked against.

    Returns:
      The budget in bytes.

    Raises:
      ValueError: unreadable text, a bare number above 1 (bytes need a unit), a fraction
        without a device size, a non-positive budget, or a budget above ``device_bytes``.

    Example:
      >>> parse_budget("52GiB"), parse_budget("0.5", device_bytes=80 * 10**9)
      (55834574848, 40000000000)
    """
    if isinstance(text, bool):
        raise TypeError(f"budget must be a string or number, got {text!r}")
    if isinstance(text, int):
        value, unit = float(text), "b"
    elif isinstance(text, float):
        value, unit = text, ""
    elif isinstance(text, str):
        m = _BUDGET_RE.match(text)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(
                f"cannot read budget {text!r}: write e.g. 52GiB, 40GB, 0.8 (fraction of the "
                "device) or 80%"
            )
        value, unit = float(m.group(1)), m.group(2).lower()
    else:
        raise TypeError(f"budget must be a string or number, got {type(text).__name__} {text!r}")
    if value <= 0:
        raise ValueError(f"budget {text!r} must be positive")
    if unit in ("", "%"):
        frac = value / 100.0 if unit == "%" else value
        if unit == "" and value > 1:
            raise ValueError(
                f"budget {text!r} is a bare number above 1: give a unit (52GiB, 40GB) or a "
                "fraction of the device in (0, 1]"
            )
        if frac > 1:
            raise ValueError(f"budget {text!r} is more than the whole device")
        if device_bytes is None:
            raise ValueError(
                f"budget {text!r} is a fraction of the device but the target has no memory "
                "size: give bytes with a unit, e.g. 52GiB"
            )
        return int(frac * device_bytes)
    budget = int(value * _UNITS[unit])
    if device_bytes is not None and budget > device_bytes:
        raise ValueError(
            f"budget {text!r} ({budget / _GIB:.2f} GiB) is larger than the device's "
            f"{device_bytes / _GIB:.2f} GiB; give at most {device_bytes / _GIB:.1f}GiB or a "
            "fraction such as 0.9"
        )
    return budget


def _limit(target: Target, budget: int | None, headroom: float) -> int:
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom={headroom!r} must be in [0, 1)")
    mem = target.memory_bytes
    if budget is None:
        if mem is None:
            raise ValueError(
                f"target {target.name!r} has no memory size: give a budget in bytes, e.g. 16GiB"
            )
        return int(mem * (1.0 - headroom))
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise TypeError(f"budget must be an int of bytes (see rk.parse_budget), got {budget!r}")
    if budget <= 0:
        raise ValueError(f"budget={budget} must be positive")
    if mem is not None and budget > mem:
        raise ValueError(
            f"budget {budget / _GIB:.2f} GiB is larger than {target.name}'s "
            f"{mem / _GIB:.2f} GiB of device memory"
        )
    return budget


def check_budget(workload: Workload, batch: int, budget: int) -> None:
    """Raises if ``budget`` is below what no rematerialization can remove.

    Weights, gradients, optimizer state, the batch and a gradient accumulator stay whatever
    the policy; a budget below their sum is infeasible before any activation is counted.

    Raises:
      ValueError: with the byte breakdown and what would fit instead (LoRA, a GPU with more
        memory, sharding over several GPUs).

    Example:
      >>> rk.check_budget(w, 4, rk.parse_budget("10GiB"))                 # doctest: +SKIP
      ValueError: llama3-8b ...: weights 14.96 GiB + gradients 14.96 GiB ... exceed ...
    """
    parts = workload.breakdown(batch)
    fixed = sum(parts.get(k, 0) for k in _FIXED_PARTS)
    if fixed <= budget:
        return
    shown = " + ".join(
        f"{name} {parts[key] / _GIB:.2f} GiB"
        for key, name in (
            ("weights", "weights"),
            ("gradients", "gradients"),
            ("optimizer", "optimizer state"),
            ("grad_accumulator", "gradient accumulator"),
            ("batch", "batch"),
        )
        if parts.get(key)
    )
    where = f"{workload.label} " if workload.label else ""
    advice = _what_would_fit(workload, parts, fixed, budget)
    raise ValueError(
        f"{where}does not fit {budget / _GIB:.2f} GiB on {workload.target.name} whatever the "
        f"policy: {shown} = {fixed / _GIB:.2f} GiB before any activation. {advice}"
    )


def _what_would_fit(workload: Workload, parts: Mapping[str, int], fixed: int, budget: int) -> str:
    hints = []
    weights = parts.get("weights", 0)
    if parts.get("gradients", 0) and weights < 0.8 * budget:
        hints.append(
            f"LoRA (--lora 16: frozen base weights carry no gradients or optimizer state, "
            f"about {weights / _GIB:.1f} GiB plus adapters)"
        )
    bigger = []
    for name in target_names():
        if name in ("cpu", "local"):
            continue
        mem = _target(name).memory_bytes or 0
        if mem * (1 - DEFAULT_HEADROOM) > fixed * 1.15 and mem > (
            workload.target.memory_bytes or 0
        ):
            bigger.append(f"{name} ({mem / _GIB:.0f} GiB)")
    if bigger:
        hints.append(f"a GPU with more memory: {', '.join(bigger)}")
    # Sharding weights, gradients and optimizer state (FSDP/ZeRO-3) divides them by the GPU
    # count; leave about a third of the budget for activations.
    n = max(2, math.ceil(fixed / (0.66 * budget)))
    hints.append(
        f"sharding weights, gradients and optimizer state over {n}+ GPUs (FSDP/ZeRO-3: about "
        f"{fixed / n / _GIB:.1f} GiB each, an estimate)"
    )
    return "What would fit: " + "; ".join(hints) + "."


# --- largest batch ------------------------------------------------------------------------------


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
    limit = _limit(workload.target, limit_bytes, headroom) if limit_bytes is None else limit_bytes
    step = max(1, int(workload.batch_multiple))
    units_cap = max(1, cap // step)

    def peak(units: int) -> int:
        return workload.report(pol, sch, units * step).peak_bytes

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
    best = workload.report(pol, sch, lo * step)
    nxt_peak = peak(hi) if hi is not None else None
    batch = lo * step
    overhead = workload.recompute_overhead(pol, sch, batch)
    msg = (
        f"{pol.spec}"
        + (f" @ {sch.spec}" if sch.name != "none" else "")
        + f": batch {batch} fits ({best.peak_bytes / _GIB:.2f} GiB of {limit / _GIB:.2f} GiB)"
        + (
            f", batch {hi * step} does not ({nxt_peak / _GIB:.2f} GiB)"
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
    r = workload.report(pol, sch, step)
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
            f"{pol.spec}: even batch {step} does not fit: {r.peak_bytes / _GIB:.2f} GiB > "
            f"{limit / _GIB:.2f} GiB on {workload.target.name}"
        ),
    )


# --- the planner --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlanCandidate:
    """One program the planner compiled.

    Attributes:
      label: how the planner got it (``none``, ``greedy x=...``, ``catalogue``, ``schedule``).
      policy, schedule: specs.
      peak_bytes: compiled peak.
      estimated_peak_bytes: the planner's estimate before compiling (None when it had none).
      recompute_overhead: extra FLOPs of recomputation (traced).
      overhead: estimated step-time overhead (recompute plus host transfer not hidden).
      host_bytes: bytes offloaded to host memory.
      fits: compiled peak <= budget.
    """

    label: str
    policy: str
    schedule: str
    peak_bytes: int
    estimated_peak_bytes: int | None
    recompute_overhead: float
    overhead: float
    host_bytes: int
    fits: bool


@dataclasses.dataclass(frozen=True)
class Plan:
    """The cheapest plan the planner found for a budget.

    Pass ``policy`` and ``schedule`` to the model (``models.get_config(name,
    policy=p.policy, schedule=p.schedule)``), or ``policy`` to ``rk.remat`` when the schedule
    is ``none``.

    Attributes:
      policy: the per-layer policy (for the layers the schedule does not name).
      schedule: the layer schedule: ``none``; ``layers`` when the first ``layers`` layers
        recompute or offload one tensor more than the rest; or a segment schedule.
      decisions: tag -> ``"save" | "recompute" | "offload"`` under ``policy``.
      layer_decisions: tag -> decision in the first ``layers`` layers, where it differs.
      layers: how many layers follow ``layer_decisions`` (0: none).
      batch: the batch planned for.
      budget_bytes: the budget.
      peak_bytes: compiled peak of the plan (the smallest reached when nothing fits).
      fits: ``peak_bytes <= budget_bytes``.
      recompute_overhead: extra FLOPs of recomputation against no remat.
      overhead: estimated step-time overhead (recompute plus host transfer not hidden).
      host_bytes: bytes offloaded to host per step.
      transfer_seconds: their estimated round trip over the host link.
      candidates: every program compiled, in order.
      compiles: programs compiled for this plan (cached ones not counted).
      seconds: wall time.
      message: one line for the user: what the plan is, or why nothing fits.
      report: the compiled report of the plan.
    """

    policy: Policy
    schedule: Schedule
    decisions: Mapping[str, str]
    layer_decisions: Mapping[str, str]
    layers: int
    batch: int
    budget_bytes: int
    peak_bytes: int
    fits: bool
    recompute_overhead: float
    overhead: float
    host_bytes: int
    transfer_seconds: float | None
    candidates: tuple[PlanCandidate, ...]
    compiles: int
    seconds: float
    message: str
    report: MemoryReport | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``policy`` or ``policy @ schedule``."""
        return _label(self.policy.spec, self.schedule.spec)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (policy and schedule as specs)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("policy", "schedule", "candidates", "report")
        }
        out.update(
            policy=self.policy.spec,
            schedule=self.schedule.spec,
            decisions=dict(self.decisions),
            layer_decisions=dict(self.layer_decisions),
            candidates=[dataclasses.asdict(c) for c in self.candidates],
        )
        return out


@dataclasses.dataclass(frozen=True)
class _State:
    """One point of the greedy sequence: which tags are saved and which offloaded."""

    save: tuple[str, ...]
    offload: tuple[str, ...]
    device_bytes: int  # residual bytes kept on the device (traced)
    flops: float
    step: str  # how this state follows the previous one, e.g. "recompute mlpwi_0"

    @property
    def policy(self) -> Policy:
        return _tag_policy(self.save, self.offload)


def _tag_policy(save: Sequence[str], offload: Sequence[str]) -> Policy:
    from remat_kit.policies import policy as _policy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the user's own tags, outside the vocabulary, are fine
        if offload:
            return _policy("offload", offload=list(offload), save=list(save))
        return _policy("names", save=list(save))


def plan(
    workload: Workload,
    batch: int,
    budget: int | None = None,
    *,
    headroom: float = DEFAULT_HEADROOM,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
    extra: Iterable[Any] = (),
    max_compiles: int = 8,
) -> Plan:
    """The plan with the lowest estimated overhead whose compiled peak fits ``budget``.

    The algorithm:

    1. ``none`` (no remat) is compiled first: if it fits, it is the plan, at zero overhead.
    2. A greedy sequence of one-tag decisions from "save every tagged tensor" to "save none":
       at each step every still-saved tag is tried as recomputed, the bytes it frees read from
       the traced residuals and its cost from the traced FLOPs (trace only, no compile), and
       the tag freeing the most bytes per extra FLOP is taken. That is the greedy for a
       fractional knapsack (bytes to shed, FLOPs as the cost), which is optimal when items
       are divisible - and step 4 makes them divisible by layer. Marginal figures at every
       step, rather than each tag's cost against "save everything" once, keep interactions
       honest: recomputing ``attn_out`` frees nothing while ``out_proj`` is kept for it.
    3. Offload (``offload=True``): an offloaded tensor crosses the host link twice per step.
       Transfers of up to ``hide`` x the step's compute time (at peak bf16) count as hidden
       behind compute, so free; within that window the tags that are the most expensive to
       recompute per byte are offloaded instead, right after the free recomputations. Offload
       that would not hide is never chosen.
    4. Positions are continuous in layers: ``x = i * L + k`` is greedy state ``i`` with its
       first ``k`` layers already at state ``i + 1`` (a ``layers`` schedule), so the plan sheds
       the bytes it must and not a whole tag more.
    5. Verification by compiling: the end of the sequence (everything recomputed or
       offloaded) is compiled; if even it does not fit, ``full`` and its segment schedules
       (``sqrt``, ``every:2``, ``nested:2/3``) are compiled in order of FLOPs. Otherwise the
       smallest ``x`` whose estimated peak fits is compiled; the estimate (compiled peak of
       a neighbour plus the residual bytes between them, a secant once two points are known)
       is corrected by every compiled peak, and the search narrows between the largest ``x``
       known not to fit and the smallest known to fit - a candidate over budget tightens it -
       for at most ``max_compiles`` compiles. A plan is only returned on a compiled peak.
    6. Policies in ``extra`` (e.g. the catalogue) whose traced overhead is below the plan's
       are compiled and taken if they fit, so the plan is never worse than what it is shown.

    Args:
      workload: the step (needs ``residuals_fn``).
      batch: the batch to plan for.
      budget: bytes (see :func:`parse_budget`); default device memory minus ``headroom``.
      headroom: used only when ``budget`` is None.
      offload: allow offloading to host memory (only where transfers hide behind compute).
      hide: fraction of the step's compute time transfers may take and count as hidden.
      extra: policies (names, specs or Policies) to compare against, e.g. the catalogue.
      max_compiles: compiles allowed for the search of step 5.

    Returns:
      The Plan. ``fits`` is False when nothing reaches the budget; ``message`` then gives the
      smallest peak reached and with what.

    Raises:
      ValueError: budget above the device memory, or below weights + gradients + optimizer
        state (the message has the breakdown and what would fit); a batch that is not a
        positive multiple of the accumulation steps.

    Example:
      >>> budget = rk.parse_budget("52GiB", w.target.memory_bytes)          # doctest: +SKIP
      >>> p = rk.plan(w, batch=4, budget=budget)
      >>> cfg = models.get_config("llama3-8b", policy=p.policy, schedule=p.schedule)
    """
    t0 = time.perf_counter()
    before = workload.compiles
    _check_batch(workload, batch)
    if not 0.0 <= hide <= 1.0:
        raise ValueError(f"hide={hide!r} must be in [0, 1]")
    budget = _limit(workload.target, budget, headroom)
    check_budget(workload, batch, budget)
    extras = [as_policy(p) for p in extra]
    ctx = _PlanContext(workload, batch, budget, hide)

    none = ctx.compile(as_policy("none"), parse_schedule("none"), "none")
    if none.fits:
        return ctx.result(none, before, t0, "no remat needed")

    states = _sequence(workload, batch, offload=offload, hide=hide)
    pos = _Positions(states, max(1, int(workload.n_layers)))
    end = ctx.compile(*pos.candidate(pos.last), f"greedy x={pos.last}")
    best, best_x = (end, pos.last) if end.fits else (None, None)
    if best is not None:
        best, best_x = _search(ctx, pos, end, max_compiles)
    else:
        best = _segment_fallback(ctx)

    if best is None:
        smallest = min(ctx.candidates, key=lambda c: c.peak_bytes)
        msg = (
            f"nothing fits {budget / _GIB:.2f} GiB on {workload.target.name} at batch {batch}: "
            f"the smallest peak reached is {smallest.peak_bytes / _GIB:.2f} GiB, with "
            f"{_label(smallest.policy, smallest.schedule)} "
            f"({(smallest.peak_bytes - budget) / _GIB:.2f} GiB over); try a smaller batch "
            "(remat-kit fit), gradient accumulation or a larger budget"
        )
        return ctx.result(smallest, before, t0, msg, fits=False)
    cheaper = _cheaper_extra(ctx, best, extras)
    if cheaper is not best:
        return ctx.result(cheaper, before, t0, "a policy given to compare is cheaper")
    if best_x is None:
        return ctx.result(best, before, t0, "segment checkpointing")
    if best_x < 0:
        last = best.label.removeprefix("repair: ")
        return ctx.result(best, before, t0, f"the greedy order, with {last} as its last step")
    i, k = pos.split(best_x)
    steps = [s.step for s in states[1 : i + 1]]
    why = "save every tagged tensor" + (", then " + ", ".join(steps) if steps else "")
    if k:
        why += f"; layers 0-{k - 1} also {states[i + 1].step}"
    return ctx.result(best, before, t0, why, upper=states[i + 1] if k else None, layers=k)


def _check_batch(workload: Workload, batch: int) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch={batch!r} must be a positive int")
    if batch % max(1, workload.batch_multiple):
        raise ValueError(
            f"batch={batch} is not a multiple of {workload.batch_multiple} (accumulation steps)"
        )


class _PlanContext:
    """The compiles of one plan() call, and how to turn the chosen one into a Plan."""

    def __init__(self, workload: Workload, batch: int, budget: int, hide: float) -> None:
        self.workload, self.batch, self.budget, self.hide = workload, batch, budget, hide
        self.candidates: list[PlanCandidate] = []
        self._objects: dict[tuple[str, str], tuple[Policy, Schedule]] = {}

    def compile(
        self, pol: Policy, sch: Schedule, label: str, estimate: int | None = None
    ) -> PlanCandidate:
        w = self.workload
        r = w.report(pol, sch, self.batch)
        cand = PlanCandidate(
            label=label,
            policy=pol.spec,
            schedule=sch.spec,
            peak_bytes=r.peak_bytes,
            estimated_peak_bytes=estimate,
            recompute_overhead=w.recompute_overhead(pol, sch, self.batch),
            overhead=w.overhead_of(r, self.batch, self.hide),
            host_bytes=_host_bytes(r),
            fits=r.peak_bytes <= self.budget,
        )
        self.candidates.append(cand)
        self._objects[(cand.policy, cand.schedule)] = (pol, sch)
        return cand

    def result(
        self,
        cand: PlanCandidate,
        before: int,
        t0: float,
        why: str,
        *,
        fits: bool = True,
        upper: _State | None = None,
        layers: int = 0,
    ) -> Plan:
        w = self.workload
        pol, sch = self._objects[(cand.policy, cand.schedule)]
        r = w.report(pol, sch, self.batch)
        tags = r.tags
        decisions = _decisions(pol, tags)
        layer_dec: dict[str, str] = {}
        if upper is not None:
            up = _decisions(upper.policy, tags)
            layer_dec = {t: d for t, d in up.items() if decisions.get(t) != d}
        if fits:
            message = (
                f"{_label(pol.spec, sch.spec)} fits {self.budget / _GIB:.2f} GiB: peak "
                f"{cand.peak_bytes / _GIB:.2f} GiB, recompute "
                f"{100 * cand.recompute_overhead:.1f}% ({why})"
            )
        else:
            message = why
        return Plan(
            policy=pol,
            schedule=sch,
            decisions=decisions,
            layer_decisions=layer_dec,
            layers=layers,
            batch=self.batch,
            budget_bytes=self.budget,
            peak_bytes=cand.peak_bytes,
            fits=fits and cand.fits,
            recompute_overhead=cand.recompute_overhead,
            overhead=cand.overhead,
            host_bytes=cand.host_bytes,
            transfer_seconds=w.transfer_seconds(cand.host_bytes),
            candidates=tuple(self.candidates),
            compiles=w.compiles - before,
            seconds=time.perf_counter() - t0,
            message=message,
            report=r,
        )


def _decisions(pol: Policy, tags: Iterable[str]) -> dict[str, str]:
    from remat_kit.policies import decide

    if not pol.is_remat:
        return {t: "save" for t in tags}
    return {t: decide(pol, t) for t in tags}


def _state(
    workload: Workload, batch: int, save: Sequence[str], off: Sequence[str], step: str
) -> _State:
    pol = _tag_policy(save, off)
    res = workload.residuals(pol, "none", batch)
    return _State(
        tuple(save), tuple(off), res.bytes_by("saved"), workload.flops(pol, "none", batch), step
    )


def _moves(workload: Workload, batch: int, cur: _State) -> list[tuple[_State, int]]:
    """Every state one recompute move away from ``cur``, with the device bytes it frees.

    A move recomputes one saved tag; when that only moves the bytes to tags it is computed
    from (``attn_out = x + out_proj`` keeps ``out_proj`` alive), those tags go with it.
    """

    def kept(st: _State) -> dict[str, int]:
        res = workload.residuals(st.policy, "none", batch)
        return {k: v["bytes"] for k, v in res.per_name().items() if v["kind"] != "offloaded"}

    out = []
    for tag in cur.save:
        rest = [t for t in cur.save if t != tag]
        nxt = _state(workload, batch, rest, cur.offload, f"recompute {tag}")
        freed = cur.device_bytes - nxt.device_bytes
        if freed <= 0:
            before, after = kept(cur), kept(nxt)
            grown = [t for t in rest if after.get(t, 0) > before.get(t, 0)]
            if not grown:
                continue
            move = (tag, *grown)
            nxt = _state(
                workload,
                batch,
                [t for t in cur.save if t not in move],
                cur.offload,
                f"recompute {'+'.join(move)}",
            )
            freed = cur.device_bytes - nxt.device_bytes
        if freed > 0:
            out.append((nxt, freed))
    return out


def _sequence(workload: Workload, batch: int, *, offload: bool, hide: float) -> list[_State]:
    """The greedy sequence of states (step 2 and 3 of :func:`plan`), cached in the workload."""
    key = ("sequence", batch, offload, hide)
    if key in workload._memo:
        return workload._memo[key]
    base = workload.baseline(batch)
    present = tuple(workload.residuals("none", "none", batch).tags)

    def state(save: Sequence[str], off: Sequence[str], step: str) -> _State:
        return _state(workload, batch, save, off, step)

    chain = [state(present, (), "save every tagged tensor")]
    while True:
        cur = chain[-1]
        scored = [
            ((freed / max(nxt.flops - cur.flops, 1e-9 * base), freed), i, nxt)
            for i, (nxt, freed) in enumerate(_moves(workload, batch, cur))
        ]
        if not scored:
            break
        chain.append(max(scored, key=lambda item: item[:2])[2])

    window = _offload_window(workload, batch, hide) if offload else 0
    if window > 0 and len(chain) > 1:
        chain = _with_offload(workload, batch, chain, window, base, state)
    workload._memo[key] = chain
    return chain


def _offload_window(workload: Workload, batch: int, hide: float) -> int:
    """Bytes per step whose host round trip hides behind ``hide`` of the step's compute."""
    step = workload.step_seconds(batch)
    link = workload.target.host_link_bandwidth
    if not step or not link:
        return 0
    return int(hide * step * link / 2)


def _with_offload(
    workload: Workload,
    batch: int,
    chain: list[_State],
    window: int,
    base: float,
    state: Callable[[Sequence[str], Sequence[str], str], _State],
) -> list[_State]:
    """Offloads, instead of recomputing, the costliest-per-byte tags that fit the window."""
    costs = [b.flops - a.flops for a, b in itertools.pairwise(chain)]
    n_free = 0
    while n_free < len(costs) and costs[n_free] <= _FREE_FLOPS * base:
        n_free += 1
    pivot = chain[n_free]
    # Single tags only: a compound step (attn_out+out_proj) is cheaper recomputed than moved.
    paid = [s.step.removeprefix("recompute ") for s in chain[n_free + 1 :]]
    paid = [t for t in paid if "+" not in t]
    if not paid:
        return chain
    kept = workload.residuals(pivot.policy, "none", batch).per_name()
    chosen, used = [], 0
    for tag in reversed(paid):  # the most expensive to recompute per byte come last
        size = kept.get(tag, {}).get("bytes", 0)
        if size and used + size <= window:
            chosen.append(tag)
            used += size
    if not chosen:
        return chain
    out = chain[: n_free + 1]
    for tag in chosen:
        cur = out[-1]
        out.append(state([t for t in cur.save if t != tag], (*cur.offload, tag), f"offload {tag}"))
    for st in chain[n_free + 1 :]:
        move = st.step.removeprefix("recompute ").split("+")
        if move[0] in chosen and len(move) == 1:
            continue
        cur = out[-1]
        out.append(state([t for t in cur.save if t not in move], cur.offload, st.step))
    return out


class _Positions:
    """Positions ``x = i * L + k`` along the greedy sequence (step 4 of :func:`plan`)."""

    def __init__(self, states: Sequence[_State], n_layers: int) -> None:
        self.states, self.L = list(states), n_layers
        self.last = (len(self.states) - 1) * n_layers

    def split(self, x: int) -> tuple[int, int]:
        i, k = divmod(x, self.L)
        if i >= len(self.states) - 1:
            return len(self.states) - 1, 0
        return i, k

    def candidate(self, x: int) -> tuple[Policy, Schedule]:
        i, k = self.split(x)
        pol = self.states[i].policy
        if not k:
            return pol, parse_schedule("none")
        # "rest" named too, so the schedule alone says what every layer does.
        layers = {range(0, k): self.states[i + 1].policy, "rest": pol}
        return pol, _make_schedule("layers", plan=layers)

    def device_bytes(self, x: int) -> float:
        i, k = self.split(x)
        a = self.states[i].device_bytes
        if not k:
            return float(a)
        return a + (self.states[i + 1].device_bytes - a) * k / self.L

    def predict(self, known: Mapping[int, int], x: int, penalty: int = 0) -> int:
        """Compiled peak at ``x`` from compiled neighbours: a secant on residual bytes."""
        left = max((p for p in known if p < x), default=None)
        right = min((p for p in known if p > x), default=None)
        bx = self.device_bytes(x)
        if left is not None and right is not None:
            bl, br = self.device_bytes(left), self.device_bytes(right)
            if bl != br:
                slope = min(max((known[left] - known[right]) / (bl - br), 0.25), 4.0)
                return int(known[right] + (bx - br) * slope) + penalty
        anchor = right if right is not None else left
        assert anchor is not None
        return int(known[anchor] + (bx - self.device_bytes(anchor))) + penalty


def _search(
    ctx: _PlanContext, pos: _Positions, end: PlanCandidate, max_compiles: int
) -> tuple[PlanCandidate, int]:
    """Step 5 of :func:`plan`: the smallest position whose compiled peak fits.

    Whole greedy states first (``k = 0``); then, between the last state that does not fit and
    the first that does, layer splits. A split runs the stack as two scans, which can cost
    memory of its own (gradients of the two weight slices); the excess seen in a compiled split
    over the straight-line estimate is added to the next predictions.
    """
    budget, L = ctx.budget, pos.L
    known: dict[int, int] = {pos.last: end.peak_bytes}
    best, best_x = end, pos.last
    lo = -L  # the largest whole state known not to fit (-L: below "save all")
    compiles = 0
    while compiles < max_compiles:
        probe = next(
            (
                x
                for x in range(lo + L, best_x, L)
                if x not in known and pos.predict(known, x) <= budget
            ),
            None,
        )
        if probe is None:
            break
        got = ctx.compile(*pos.candidate(probe), f"greedy x={probe}", pos.predict(known, probe))
        compiles += 1
        known[probe] = got.peak_bytes
        if got.fits:
            best, best_x = got, probe
        else:
            lo = max(lo, probe)
    if best_x < L:
        return best, best_x
    # Greedy by ratio may take a big step where a smaller, cheaper one would do (a knapsack
    # item that overshoots): from the last state that does not fit, try the cheapest single
    # move that frees enough, by its traced bytes and FLOPs.
    prev_x = best_x - L
    prev = pos.states[prev_x // L]
    need = (known[prev_x] if prev_x in known else pos.predict(known, prev_x)) - budget
    for nxt, freed in sorted(_moves(ctx.workload, ctx.batch, prev), key=lambda m: m[0].flops):
        if nxt.flops >= pos.states[best_x // L].flops or compiles >= max_compiles:
            break
        if freed < need:
            continue
        got = ctx.compile(nxt.policy, parse_schedule("none"), f"repair: {nxt.step}")
        compiles += 1
        if got.fits and got.overhead < best.overhead:
            return got, -1  # not on the sequence
        break
    if L == 1:
        return best, best_x
    # Layer splits between the state before (does not fit) and best_x's (fits).
    whole = {x: p for x, p in known.items() if x % L == 0}
    penalty, hi, lo = 0, best_x, prev_x
    while compiles < max_compiles:
        probe = next(
            (
                x
                for x in range(lo + 1, hi)
                if x not in known and pos.predict(whole, x, penalty) <= budget
            ),
            None,
        )
        if probe is None:
            break
        estimate = pos.predict(whole, probe, penalty)
        got = ctx.compile(*pos.candidate(probe), f"greedy x={probe}", estimate)
        compiles += 1
        known[probe] = got.peak_bytes
        penalty = max(penalty, got.peak_bytes - pos.predict(whole, probe))
        if got.fits:
            hi = probe
            if got.overhead < best.overhead:
                best, best_x = got, probe
    return best, best_x


def _segment_fallback(ctx: _PlanContext) -> PlanCandidate | None:
    """``full``, then with segment schedules, cheapest FLOPs first; the first that fits.

    ``full`` comes first: the greedy's end point can keep tags whose recomputation frees
    nothing on its own (``decoder_layer_input``) or offload buffers, so it is not always the
    smallest per-layer policy.
    """
    w, full = ctx.workload, as_policy("full")
    options = [parse_schedule(s) for s in ("none", "sqrt", "every:2", "nested:2", "nested:3")]
    if w.n_layers < 4:
        options = options[:3]
    options.sort(key=lambda s: w.flops(full, s, ctx.batch))
    for sch in options:
        got = ctx.compile(full, sch, "schedule")
        if got.fits:
            return got
    return None


def _cheaper_extra(
    ctx: _PlanContext, best: PlanCandidate, extras: Sequence[Policy]
) -> PlanCandidate:
    """The cheapest policy in ``extras`` that fits and beats ``best``, else ``best``."""
    w, none = ctx.workload, parse_schedule("none")
    ranked = sorted(
        (w.recompute_overhead(p, none, ctx.batch), i, p) for i, p in enumerate(extras) if p.is_remat
    )
    for recompute, _, p in ranked:
        if recompute >= best.overhead - 1e-9:
            break
        got = ctx.compile(p, none, "catalogue")
        if got.fits and got.overhead < best.overhead - 1e-9:
            best = got
    return best


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
    full = max_batch(workload, "full", headroom=headroom, start=start)
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


def _label(policy: str, schedule: str) -> str:
    return policy if schedule in ("none", "", None) else f"{policy} @ {schedule}"


# --- the Pareto front ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FrontPoint:
    """One point of a memory / overhead front.

    Attributes:
      label: what it is (policy, ``policy @ schedule``, ``plan 52.0 GiB``).
      kind: ``catalogue``, ``schedule`` or ``plan``.
      peak_bytes: compiled peak.
      overhead: estimated step-time overhead (recompute plus exposed host transfer).
      recompute_overhead: extra FLOPs of recomputation.
      fits: the peak fits the device (None when unknown).
      dominated: another point is at most as large and at most as slow, and better in one.
      dominated_by: the label of one such point.
    """

    label: str
    kind: str
    peak_bytes: int
    overhead: float
    recompute_overhead: float
    fits: bool | None = None
    dominated: bool = False
    dominated_by: str | None = None


def pareto_front(points: Iterable[FrontPoint], *, rtol: float = 1e-6) -> tuple[FrontPoint, ...]:
    """Marks each point dominated or not (smaller peak and lower overhead both win).

    A point is dominated when another has a peak and an overhead no larger and is strictly
    better in at least one (overheads within ``rtol`` count as equal). Identical points do not
    dominate each other.

    Args:
      points: the points, any order.
      rtol: tolerance on overhead (float noise), relative to the larger of 1 and the value.

    Returns:
      The points in the same order, with ``dominated``/``dominated_by`` set.

    Example:
      >>> a = FrontPoint("a", "catalogue", 10, 0.2, 0.2)
      >>> b = FrontPoint("b", "catalogue", 12, 0.3, 0.3)
      >>> [p.dominated for p in pareto_front([a, b])]
      [False, True]
    """
    pts = list(points)
    out = []
    for p in pts:
        by = None
        for q in pts:
            if q is p:
                continue
            tol = rtol * max(1.0, abs(p.overhead))
            le_peak, le_over = q.peak_bytes <= p.peak_bytes, q.overhead <= p.overhead + tol
            strict = q.peak_bytes < p.peak_bytes or q.overhead < p.overhead - tol
            if le_peak and le_over and strict:
                by = q.label
                break
        out.append(dataclasses.replace(p, dominated=by is not None, dominated_by=by))
    return tuple(out)


def front(
    workload: Workload,
    batch: int,
    *,
    policies: Iterable[Any] = FRONT_POLICIES,
    schedules: Iterable[tuple[Any, Any]] = FRONT_SCHEDULES,
    plans: Iterable[Plan] = (),
    hide: float = DEFAULT_HIDE,
) -> tuple[FrontPoint, ...]:
    """Compiles catalogue policies and segment schedules; returns them and ``plans`` as a front.

    Args:
      workload: the step.
      batch: the batch.
      policies: catalogue policies (names/specs/Policies), each with schedule ``none``.
      schedules: ``(policy, schedule)`` pairs.
      plans: Plans for the same workload and batch.
      hide: as for :func:`plan` (offload beyond it counts as overhead).

    Returns:
      FrontPoints with dominated ones marked (see :func:`pareto_front`).

    Example:
      >>> pts = rk.front(w, 4, plans=[rk.plan(w, 4)])                    # doctest: +SKIP
      >>> [p.label for p in pts if not p.dominated]
    """
    pts = []
    for spec in policies:
        pol = as_policy(spec)
        pts.append(
            _point(workload, batch, pol, parse_schedule("none"), pol.spec, "catalogue", hide)
        )
    for spec, sch in schedules:
        pol, s = as_policy(spec), parse_schedule(sch)
        pts.append(_point(workload, batch, pol, s, _label(pol.spec, s.spec), "schedule", hide))
    for p in plans:
        if p.batch != batch:
            raise ValueError(f"a plan for batch {p.batch} cannot join a front for batch {batch}")
        pts.append(
            FrontPoint(
                label=f"plan {p.budget_bytes / _GIB:.2f} GiB",
                kind="plan",
                peak_bytes=p.peak_bytes,
                overhead=p.overhead,
                recompute_overhead=p.recompute_overhead,
                fits=p.report.fits if p.report is not None else None,
            )
        )
    return pareto_front(pts)


def _point(
    w: Workload, batch: int, pol: Policy, sch: Schedule, label: str, kind: str, hide: float
) -> FrontPoint:
    r = w.report(pol, sch, batch)
    return FrontPoint(
        label=label,
        kind=kind,
        peak_bytes=r.peak_bytes,
        overhead=w.overhead_of(r, batch, hide),
        recompute_overhead=w.recompute_overhead(pol, sch, batch),
        fits=r.fits,
    )


def plot_front(
    points: Sequence[FrontPoint],
    path: Any,
    *,
    title: str = "",
    budget_bytes: int | None = None,
    device_bytes: int | None = None,
) -> None:
    """Draws peak memory against overhead, dominated points hollow, the front as a line.

    Args:
      points: FrontPoints (see :func:`front`).
      path: where the PNG goes.
      title: the plot title.
      budget_bytes: draws the budget as a vertical line.
      device_bytes: draws the device memory as a vertical line.

    Example:
      >>> rk.plot_front(rk.front(w, 4), "front.png", title="llama3-8b")   # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"catalogue": "tab:blue", "schedule": "tab:green", "plan": "tab:red"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for kind, color in colors.items():
        for dominated in (False, True):
            sel = [p for p in points if p.kind == kind and p.dominated == dominated]
            if not sel:
                continue
            ax.scatter(
                [p.peak_bytes / _GIB for p in sel],
                [100 * p.overhead for p in sel],
                facecolors="none" if dominated else color,
                edgecolors=color,
                marker="o" if kind != "plan" else "D",
                label=f"{kind}{' (dominated)' if dominated else ''}",
                zorder=3,
            )
    for p in points:
        if math.isfinite(p.overhead):
            ax.annotate(
                p.label,
                (p.peak_bytes / _GIB, 100 * p.overhead),
                fontsize=6,
                alpha=0.8,
                xytext=(3, 3),
                textcoords="offset points",
            )
    on = sorted(
        (p for p in points if not p.dominated and math.isfinite(p.overhead)),
        key=lambda p: p.peak_bytes,
    )
    if on:
        ax.step(
            [p.peak_bytes / _GIB for p in on],
            [100 * p.overhead for p in on],
            where="post",
            color="gray",
            lw=1,
            zorder=1,
            label="front",
        )
    top = max((p.peak_bytes for p in points), default=0)
    for value, name, style in ((budget_bytes, "budget", "--"), (device_bytes, "device", ":")):
        # A device far beyond every point would squash the plot: leave it out then.
        if value and value <= 1.3 * top:
            ax.axvline(value / _GIB, color="black", ls=style, lw=1, label=name)
    ax.set_xlabel("compiled peak (GiB)")
    ax.set_ylabel("estimated overhead (% of step FLOPs)")
    finite = [100 * p.overhead for p in points if math.isfinite(p.overhead)]
    if finite:
        ax.set_ylim(-2, min(max(finite) * 1.1 + 2, 150))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- which GPU to rent --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Advice:
    """Does the step fit one GPU target, and how.

    Attributes:
      target: target name; ``memory_bytes`` its device memory.
      fits: a plan fits the device minus headroom at the requested batch.
      plan: the plan's label (policy @ schedule), or None.
      peak_bytes: the plan's compiled peak (the smallest reached when nothing fits).
      recompute_overhead, overhead: of the plan.
      max_batch: the largest batch with ``full`` (the planner's most frugal per-layer policy).
      fixed_bytes: weights + gradients + optimizer state + batch.
      message: one line (why not, or what the plan is).
      seconds: wall time for this target.
    """

    target: str
    memory_bytes: int | None
    fits: bool
    plan: str | None
    peak_bytes: int | None
    recompute_overhead: float | None
    overhead: float | None
    max_batch: int
    fixed_bytes: int
    message: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def advise(
    workload_for: Callable[[Target], Workload],
    batch: int,
    *,
    targets: Iterable[str] | None = None,
    headroom: float = DEFAULT_HEADROOM,
    offload: bool = True,
    hide: float = DEFAULT_HIDE,
) -> tuple[Advice, ...]:
    """For every GPU target: does the step fit, with which plan, overhead and max batch.

    Args:
      workload_for: builds the Workload of the step for one Target.
      batch: the batch the user wants.
      targets: target names (default every GPU in ``rk.target_names()``).
      headroom: fraction of device memory left free.
      offload, hide: as for :func:`plan`.

    Returns:
      One Advice per target, in the order given (default: by name).

    Raises:
      ValueError: an unknown target name.

    Example:
      >>> rows = rk.advise(lambda t: workload(opts, t), batch=4)          # doctest: +SKIP
      >>> [(a.target, a.fits, a.plan) for a in rows]
    """
    names = (
        [n for n in target_names() if n not in ("cpu", "local")]
        if targets is None
        else list(targets)
    )
    resolved = [_target(n) for n in names]  # unknown names fail before any compile
    out = []
    for t in resolved:
        t0 = time.perf_counter()
        w = workload_for(t)
        fixed = w.fixed_bytes(batch)
        try:
            p = plan(w, batch, None, headroom=headroom, offload=offload, hide=hide)
        except ValueError as err:
            if "whatever the policy" not in str(err):
                raise
            out.append(
                Advice(
                    t.name,
                    t.memory_bytes,
                    False,
                    None,
                    None,
                    None,
                    None,
                    0,
                    fixed,
                    str(err),
                    time.perf_counter() - t0,
                )
            )
            continue
        fit = max_batch(w, "full", headroom=headroom, start=batch if p.fits else None)
        out.append(
            Advice(
                target=t.name,
                memory_bytes=t.memory_bytes,
                fits=p.fits,
                plan=p.label,
                peak_bytes=p.peak_bytes,
                recompute_overhead=p.recompute_overhead,
                overhead=p.overhead,
                max_batch=fit.max_batch,
                fixed_bytes=fixed,
                message=p.message,
                seconds=time.perf_counter() - t0,
            )
        )
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class ScaleOut:
    """The fewest GPUs of one kind whose per-GPU compiled peak fits, sharded.

    Attributes:
      target: target name.
      devices: GPUs needed (None when none of the counts tried fits).
      batch: the global batch compiled at that count (the requested batch rounded up to a
        multiple of the data-parallel ways).
      policy: the per-layer policy compiled.
      peak_bytes: per-GPU compiled peak at ``devices`` (None when nothing fits).
      tried: (devices, per-GPU peak) for every count compiled.
      message: one line for the user.
    """

    target: str
    devices: int | None
    batch: int
    policy: str
    peak_bytes: int | None
    tried: tuple[tuple[int, int], ...]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def gpus_needed(
    workload_for: Callable[[int], Workload],
    batch: int,
    *,
    policy: Any = "full",
    counts: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    headroom: float = DEFAULT_HEADROOM,
) -> ScaleOut:
    """The fewest GPUs (from ``counts``, in order) whose sharded step fits each GPU.

    Each count is compiled (per-GPU figures, e.g. FSDP over that many devices, as
    ``workload_for`` builds it) under ``policy``; the first whose compiled peak fits the
    device minus ``headroom`` is the answer. Per-GPU weights, gradients and optimizer state
    shrink with the count under FSDP, so the search stops at the first fit.

    Args:
      workload_for: builds the Workload for ``n`` devices (its target has ``n`` devices).
      batch: the global batch wanted; rounded up to the workload's batch multiple.
      policy: the per-layer policy (default ``full``, the most frugal one).
      counts: device counts to try, ascending.
      headroom: fraction of device memory left free.

    Returns:
      A ScaleOut.

    Example:
      >>> so = rk.gpus_needed(lambda n: workload(fsdp(n), target(n)), batch=8)  # doctest: +SKIP
      >>> so.devices
    """
    pol = as_policy(policy)
    tried: list[tuple[int, int]] = []
    name, b = "?", batch
    for n in counts:
        w = workload_for(n)
        name = w.target.name
        limit = _limit(w.target, None, headroom)
        b = -(-batch // w.batch_multiple) * w.batch_multiple
        peak = w.report(pol, parse_schedule("none"), b).peak_bytes
        tried.append((n, peak))
        if peak <= limit:
            return ScaleOut(
                name,
                n,
                b,
                pol.spec,
                peak,
                tuple(tried),
                f"{n} x {name}: {peak / _GIB:.1f} GiB per GPU with {pol.spec} at global batch {b}",
            )
    return ScaleOut(
        name,
        None,
        b,
        pol.spec,
        None,
        tuple(tried),
        f"does not fit {counts[-1]} x {name} with {pol.spec}: "
        f"{tried[-1][1] / _GIB:.1f} GiB per GPU",
    )
