"""The measuring pipeline: any model source's train step, compiled or traced.

One pipeline for every :class:`~remat_kit.sources.StepSource` (a preset, a Hugging Face
config, a factory): the report with its breakdown and warnings, FLOPs, saved residuals, the
tags a policy may name, and the :class:`~remat_kit.Workload` the search runs on. Answers of a
source that names its inputs (:meth:`StepSource.cache_parts`) are remembered on disk.

Example:
  >>> src = rk.sources.from_factory(tiny_model)  # any StepSource: a factory here
  >>> config = rk.TrainConfig(batch=2, seq=16)
  >>> r = rk.sources.measure(src, "full", "h100", config, warn=False)
  >>> r.peak_bytes == r.argument_bytes + r.output_bytes + r.temp_bytes - r.alias_bytes
  True
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import jax

from remat_kit import checks
from remat_kit.analysis import MemoryReport, RematWarning, memory_report, transfer_estimate
from remat_kit.breakdown import add_breakdown, add_measured_breakdown
from remat_kit.errors import BadValue
from remat_kit.flops import FlopCount, count_flops
from remat_kit.notes import Note
from remat_kit.policies import NO_REMAT, Policy, PolicyLike, as_policy, recompute_instead
from remat_kit.residuals import ResidualReport, saved_residuals
from remat_kit.schedules import NO_SCHEDULE, Schedule, parse_schedule
from remat_kit.sources._depth import (
    DEPTHS,
    by_depth,
    check_depth,
    line_at,
    shallow_copies,
    verify,
    verify_search,
)
from remat_kit.sources._measured import Answers
from remat_kit.sources._protocol import SourceStep, StepSource
from remat_kit.sources._remember import _remembered
from remat_kit.sources._tag_checks import check_policies
from remat_kit.targets import Target, as_target
from remat_kit.train import TrainConfig

__all__ = [
    "breakdown",
    "measure",
    "nbytes_count",
    "residuals",
    "step_flop_count",
    "step_flops",
    "with_baseline",
]


def measure(
    source: StepSource,
    policy: PolicyLike,
    target: Target | str,
    config: TrainConfig,
    *,
    schedule: Any = "none",
    baseline: float | None = None,
    strict: bool = False,
    warn: bool = True,
    measured_breakdown: bool = False,
    meta: Mapping[str, Any] | None = None,
    depth: str = "auto",
) -> MemoryReport:
    """Compiles the train step of ``source`` under ``policy`` for ``target`` and reports it.

    Before compiling, the source checks its traced program (a factory's must hold a
    checkpoint with ``policy`` and differ from the previous policy's: a stale or ignored
    trace), and with ``strict`` a name-based policy must match a tag of the model. Offload
    that XLA did not carry out is a warning with both figures; offload the host link cannot
    hide is a warning with the estimate.

    Args:
      source: the model source.
      policy: a policy name, spec or Policy.
      target: a Target or target name.
      config: batch, sequence, optimizer, precision ...
      schedule: a layer schedule the source can build.
      baseline: FLOPs of the step without remat: the report's meta then holds
        ``recompute_overhead`` = flops / baseline - 1.
      strict: a name-based policy matching no tag is an error, not a warning.
      warn: issue the report's warnings as RematWarning.
      measured_breakdown: read the breakdown from XLA's buffer assignment (a second compile,
        with XLA's dump; unsharded steps only) instead of the shapes' estimate, which is
        kept in ``meta["breakdown_estimate"]``.
      meta: extra labels for the report.
      depth: ``"auto"``: an unrolled stack of identical layers is answered from compiles
        of shallow copies (:mod:`remat_kit.sources._depth`) where it fits with room to
        spare, and compiled at full depth where the copies do not line up or the peak
        comes near the usable memory or over it; ``"full"``: always compile the whole
        model; ``"check"``: both, the full compile reported with the extrapolation's
        error; ``"estimate"``: the copies' figures whatever the verdict (a search, which
        compiles its final answers whole). ``meta["depth"]`` says what was done.

    Returns:
      The MemoryReport, with the weights/gradients/optimizer/activations breakdown.

    Raises:
      BadValue: a config the source refuses (its ``check``), a stale trace, an unbuildable
        schedule, (``strict``) an unmatched policy, a measured breakdown asked of a sharded
        step, or an unknown ``depth``.

    Example:
      >>> src = rk.sources.from_factory(tiny_model)
      >>> r = measure(src, "full", "h100", rk.TrainConfig(batch=2, seq=16), warn=False)
      >>> r.policy, r.meta["model"], r.meta["params"]
      ('full', 'tiny_model', 3184)
    """
    t = as_target(target)
    pol, sch = as_policy(policy), parse_schedule(schedule)
    check_depth(depth)
    source.check(config, t)
    if strict:
        check_policies(source, config, t, [pol])
    if measured_breakdown and source.mesh_plan(t) is not None:
        raise BadValue(
            "a measured breakdown reads one unsharded program: measure it unsharded, or "
            "take the shapes' estimate",
            param="measured_breakdown",
        )

    def compute() -> MemoryReport:
        return _measure(source, pol, sch, t, config, baseline, measured_breakdown, meta, depth)

    if pol.name == "custom" or meta:
        report = compute()  # a callable has no spec to remember it by
    else:
        report = _remembered(
            "report",
            source,
            t,
            config,
            compute,
            policy=pol.spec,
            schedule=sch.spec,
            baseline=baseline,
            measured_breakdown=measured_breakdown,
            depth=depth,
        )
    if warn:
        for note in report.warnings:
            warnings.warn(note, RematWarning, stacklevel=2)
    return report


def _labels(
    source: StepSource,
    built: SourceStep,
    config: TrainConfig,
    t: Target,
    meta: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What a report of ``built`` says of its step (``meta``): the model, the sequences and
    tokens one step trains, the optimizer, the precision, jax's remat implementation, the
    mesh; then the source's own and the caller's ``meta``."""
    step = built.step
    sequences = source.sequences_per_step(config, t)
    labels: dict[str, Any] = {
        "model": source.spec,
        "batch": sequences,
        "seq": config.seq,
        "optimizer": config.optimizer,
        "accum": config.accum,
        "precision": dict(step.precision),
        "tokens_per_step": sequences * config.seq,
        # Which of jax's remat implementations traced the step (its jax_remat3 flag): the
        # two can give another program for the same policy.
        "remat_impl": "remat3" if jax.config.jax_remat3 else "default",
        **built.meta,
    }
    if step.plan is not None:
        labels.update(
            mesh=step.plan.spec,
            devices=t.devices,
            hosts=t.hosts,
            batch_per_device=config.batch // step.plan.data_size,
        )
    labels.update(meta or {})
    return labels


def _measure(
    source: StepSource,
    pol: Policy,
    sch: Schedule,
    t: Target,
    config: TrainConfig,
    baseline: float | None,
    measured_breakdown: bool,
    meta: Mapping[str, Any] | None,
    depth: str,
) -> MemoryReport:
    built = source.build_step(pol, sch, config, t)
    source.check_step(built, f"{source.spec} (b{config.batch} s{config.seq})")
    step = built.step
    labels = _labels(source, built, config, t, meta)

    def compile_step(b: SourceStep, dump_to: str | None = None) -> MemoryReport:
        # A shallow copy's report carries the full model's labels: lines through them
        # keep them as they are.
        return memory_report(
            b.step.fn,
            *b.step.args,
            target=t,
            donate_argnums=b.step.donate_argnums,
            in_shardings=b.step.in_shardings,
            out_shardings=b.step.out_shardings,
            policy=b.policy,
            attention=b.attention,
            schedule=b.schedule.spec,
            meta=labels,
            warn=False,
            dump_to=dump_to,
        )

    report, record = None, {}
    if depth != "full" and not measured_breakdown:
        report, record = by_depth(source, pol, sch, t, config, compile_step)
    if report is not None:
        report = report.replace(meta={**report.meta, "depth": record})
        if depth != "estimate":
            report = verify(report, lambda: compile_step(built), always=depth == "check")
    else:
        report = compile_step(built)
        if record:
            report = report.replace(meta={**report.meta, "depth": record})
    if measured_breakdown:
        report = add_measured_breakdown(report, step, t)
    else:
        report = add_breakdown(report, step)
    if baseline:
        report = with_baseline(report, baseline)
    if pol.offloads and report.host_bytes:
        report = _with_offload_estimate(report, source, pol, sch, config, t)
    if pol.offloads and step.plan is None and t.devices == 1 and step.loss_given:
        # XLA may carry out only part of the copies jax marks (unrolled layers): say so. Both
        # figures are one micro-batch's on one device (sharded steps are not compared).
        marked = residuals(source, pol, t, config, sch).marked_bytes
        note = checks.offload_shortfall(report, marked)
        if note is not None:
            report = report.replace(notes=(*report.notes, note))
    if pol.jax_policy is not None and checks.keeps_dots(pol.jax_policy):
        # A dot policy on a mixture of experts recomputes the grouped expert GEMMs (jax's
        # dot policies see dot_general only): say so, with the bytes.
        ways = source.batch_ways(t)
        notes = _expert_notes(source, pol, sch, config, t, ways, bool(jax.config.jax_remat3))
        report = report.replace(notes=(*report.notes, *notes))
    return report


@functools.lru_cache(maxsize=64)
def _expert_notes(
    source: StepSource,
    pol: Policy,
    sch: Schedule,
    config: TrainConfig,
    t: Target,
    ways: int,
    remat3: bool,
) -> tuple[Note, ...]:
    # remat3: jax's remat implementation, part of the memo's key only (the trace below runs
    # under the flag as it is).
    # Traced (not compiled) at one GPU's micro-batch, unsharded: the forward program, where
    # each checkpoint's body is what its policy decides on. Never below the smallest batch
    # the source's steps take (MaxText refuses a batch its pipeline's micro-batches do not
    # divide).
    one = dataclasses.replace(config, accum=1)
    one = dataclasses.replace(
        one, batch=max(source.smallest_batch(one, t), config.micro_batch // ways)
    )
    step = source.build_step(pol, sch, one, t, sharded=False).step
    forward = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
    found = (checks.ragged_dots_recomputed(forward), checks.expert_dots_recomputed(forward))
    return tuple(n for n in found if n is not None)


def _with_offload_estimate(
    report: MemoryReport,
    source: StepSource,
    pol: Policy,
    sch: Schedule,
    config: TrainConfig,
    t: Target,
) -> MemoryReport:
    # The same step with the offloaded tensors recomputed instead: traced, not compiled. That
    # policy is ours, not the user's: the tag check of the model it builds has nothing to say
    # (the user's policy was checked), and its warning named a policy the user never gave.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematWarning)
        alt = source.build_step(recompute_instead(pol), sch, config, t, sharded=False).step
        extra = count_flops(alt.fn, *alt.args).total - report.flops
    est = transfer_estimate(report, t, max(extra, 0.0))
    if est is None:
        return report
    notes = list(report.notes)
    if est.link_bound:
        notes.append(
            Note(
                "offload_link_bound",
                {
                    "target": t.name,
                    "host_bytes": est.host_bytes,
                    "transfer_seconds": est.transfer_seconds,
                    "step_compute_seconds": est.step_compute_seconds,
                },
            )
        )
    return report.replace(
        meta={**report.meta, "offload_estimate": est._asdict()}, notes=tuple(notes)
    )


def nbytes_count(tree: Any) -> int:
    """Number of elements in a pytree of arrays or ShapeDtypeStructs (a parameter count).

    Example:
      >>> nbytes_count({"w": jax.ShapeDtypeStruct((3, 4), "float32")})
      12
    """
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


def with_baseline(report: MemoryReport, baseline: float) -> MemoryReport:
    """``report`` with ``meta["recompute_overhead"]``: its FLOPs over ``baseline``'s, less 1.

    Args:
      report: a compiled report (its ``flops`` counted from its own trace).
      baseline: FLOPs of the same step without remat (``step_flops(..., "none", ...)``, or
        the FLOPs of a ``none`` report of the same step).

    Returns:
      The report with the overhead in its meta.

    Example:
      >>> r = rk.memory_report(lambda x: x @ x, jnp.ones((4, 4)), target="h100")
      >>> with_baseline(r, r.flops / 2).meta["recompute_overhead"]
      1.0
    """
    return report.replace(meta={**report.meta, "recompute_overhead": report.flops / baseline - 1.0})


def step_flops(
    source: StepSource,
    policy: PolicyLike,
    target: Target | str,
    config: TrainConfig,
    schedule: Any = "none",
) -> float:
    """FLOPs of the train step of ``source`` under ``policy`` (traced, not compiled).

    Args:
      source: the model source.
      policy: a policy name, spec or Policy.
      target: where it would run (the attention kernel may depend on it).
      config: batch, sequence, optimizer ...
      schedule: a layer schedule the source can build.

    Returns:
      The FLOPs of one optimizer step, forward, backward and recomputation.
    """
    return step_flop_count(source, policy, target, config, schedule).total


def step_flop_count(
    source: StepSource,
    policy: PolicyLike,
    target: Target | str,
    config: TrainConfig,
    schedule: Any = "none",
) -> FlopCount:
    """:func:`step_flops` split by kind (products, attention kernels, elementwise), which the
    planner prices at each kind's rate (:func:`remat_kit.timing._traced.traced_seconds`).

    Args:
      source: the model source.
      policy: a policy name, spec or Policy.
      target: where it would run (the attention kernel may depend on it).
      config: batch, sequence, optimizer ...
      schedule: a layer schedule the source can build.

    Returns:
      The FlopCount of one optimizer step.
    """
    t = as_target(target)
    pol, sch = as_policy(policy), parse_schedule(schedule)

    def count(src: StepSource) -> dict[str, Any]:
        step = src.build_step(pol, sch, config, t, sharded=False).step
        return count_flops(step.fn, *step.args).to_dict()

    def compute() -> dict[str, Any]:
        # FLOPs of identical layers are affine in depth: an unrolled stack is counted from
        # its shallow copies (a 32-layer trace was a third of compare's time).
        copies = shallow_copies(source, sch, t)
        if copies is None:
            return count(source)
        return line_at([count(c) for c in copies], DEPTHS, source.n_layers())

    if pol.name == "custom":
        return FlopCount(**compute())
    counted = _remembered(
        "flop_count", source, t, config, compute, policy=pol.spec, schedule=sch.spec
    )
    return FlopCount(**counted)


def residuals(
    source: StepSource,
    policy: PolicyLike,
    target: Target | str,
    config: TrainConfig,
    schedule: Any = "none",
) -> ResidualReport:
    """What ``policy`` keeps for the backward pass of one micro-batch, by tag (traced).

    A name-based policy that matches no tag there is a RematWarning.

    Args:
      source: the model source.
      policy: a policy name, spec or Policy.
      target: where it would run.
      config: batch, sequence ... (the unsharded step is traced).
      schedule: a layer schedule the source can build.

    Returns:
      The ResidualReport.

    Raises:
      BadValue: a step given without its loss (``TrainStep.loss_given``).
    """
    t = as_target(target)
    built = source.build_step(as_policy(policy), parse_schedule(schedule), config, t, sharded=False)
    step = built.step
    if not step.loss_given:
        raise BadValue(
            f"{source.spec} gave its step without its loss: the residuals a policy keeps are "
            "read from the loss's backward pass; return OwnStep(..., loss_fn=, loss_args=)"
        )
    report = saved_residuals(step.loss_fn, *step.loss_args, policy=built.policy)
    checks.check_policy_matches(built.policy, report.tags, where=source.spec)
    return report


def breakdown(source: StepSource, config: TrainConfig, target: Target | str) -> dict[str, int]:
    """Bytes of weights, gradients, optimizer state, batch and accumulator (from shapes).

    Per device when the source shards its steps.
    """
    t = as_target(target)
    built = source.build_step(NO_REMAT, NO_SCHEDULE, config, t)
    return dict(built.step.breakdown)


def answers_of(
    src: StepSource, t: Target, config: TrainConfig, *, strict: bool, depth: str
) -> Answers:
    """What a Workload of ``src`` on ``t`` asks of its step, at any batch of ``config``.

    Probes of an unrolled model are read off shallow copies where ``depth`` is ``auto``
    (``estimate``), final answers compiled whole (``verify``); residuals are one device's
    share of the batch (tp splits it further; compiles verify).

    Example:
      >>> a = answers_of(rk.sources.from_factory(tiny_model), rk.target("h100"),
      ...     rk.TrainConfig(batch=2, seq=16), strict=False, depth="auto")
      >>> a.label, a.batch_multiple, a.resizes
      ('tiny_model s16 adamw', 1, True)
    """
    probes = "estimate" if check_depth(depth) == "auto" else depth
    ways = src.batch_ways(t)

    def at(batch: int) -> TrainConfig:
        return dataclasses.replace(config, batch=batch)

    def probe(pol: Policy, sch: Schedule, batch: int) -> MemoryReport:
        return measure(src, pol, t, at(batch), schedule=sch, strict=strict, warn=False,
                       depth=probes)  # fmt: skip

    def whole(pol: Policy, sch: Schedule, batch: int) -> MemoryReport:
        return measure(src, pol, t, at(batch), schedule=sch, strict=strict, warn=False,
                       depth="full")  # fmt: skip

    def residuals_of(pol: Policy, sch: Schedule, batch: int) -> ResidualReport:
        return residuals(src, pol, t, at(max(src.smallest_batch(config, t), batch // ways)), sch)

    n_layers = src.n_layers() if "layers" in src.schedule_kinds else None
    return Answers(
        measure=probe,
        flops=lambda p, s, b: step_flop_count(src, p, t, at(b), s),
        residuals=residuals_of,
        breakdown=lambda b: breakdown(src, at(b), t),
        verify=lambda p, s, b, r, limit: verify_search(r, lambda: whole(p, s, b), limit),
        sequences=lambda b: src.sequences_per_step(at(b), t),
        n_layers=n_layers or 1,
        batch_multiple=config.accum * ways,
        schedule_kinds=src.schedule_kinds,
        remat_always=src.remat_always,
        label=src.label(config, t),
        resizes=True,
    )
