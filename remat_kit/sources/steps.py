"""A model source's train step, compiled or traced: reports, FLOPs, residuals, a Workload.

Example:
  >>> import remat_kit as rk                                              # doctest: +SKIP
  >>> src = rk.sources.from_factory("my_model.py:build")
  >>> rk.sources.measure(src, "minimal", "h100", rk.TrainConfig(batch=2, seq=64)).peak_bytes
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import jax

from remat_kit import checks
from remat_kit.analysis import MemoryReport, RematWarning, memory_report
from remat_kit.breakdown import add_breakdown
from remat_kit.flops import count_flops
from remat_kit.residuals import ResidualReport, saved_residuals, tags_in
from remat_kit.schedules import Schedule
from remat_kit.search.workload import Workload
from remat_kit.sources.source import ModelSource, from_factory
from remat_kit.targets import Target, as_target
from remat_kit.train import TrainConfig

__all__ = [
    "measure",
    "nbytes_count",
    "residuals",
    "step_flops",
    "workload",
]


def _schedule_policies(sch: Schedule) -> list[Any]:
    # Policies a schedule may put on layers instead of the model's: its plan's and segments'.
    out: list[Any] = [p for _, _, p in sch.plan]
    out += [p for p in (sch.rest, sch.inner) if p]
    if sch.name in ("every", "sqrt", "nested"):
        out.append("full")
    return out


def measure(
    source: ModelSource,
    policy: Any,
    target: Target | str,
    config: TrainConfig,
    *,
    schedule: Any = "none",
    baseline: float | None = None,
    strict: bool = False,
    warn: bool = True,
    meta: Mapping[str, Any] | None = None,
) -> MemoryReport:
    """Compiles the train step of ``source`` under ``policy`` for ``target`` and reports it.

    Before compiling, the forward pass of one micro-batch is traced and checked: the program
    must hold a checkpoint with ``policy`` and differ from the one traced for the previous
    policy (else BadValue: a stale or ignored trace), and a name-based policy must match a
    tag there (else a RematWarning, or BadValue with ``strict``). Offload that XLA did not
    carry out is a warning with both figures.

    Args:
      source: the model source.
      policy: a policy name, spec or Policy.
      target: a Target or target name.
      config: batch, sequence, optimizer, precision ...
      schedule: a layer schedule the source can build.
      baseline: FLOPs of the step without remat: the report's meta then holds
        ``recompute_overhead``.
      strict: a policy matching no tag is an error, not a warning (the CLI).
      warn: issue the report's warnings as RematWarning.
      meta: extra labels for the report.

    Returns:
      The MemoryReport, with the weights/gradients/optimizer/activations breakdown.

    Raises:
      BadValue: a stale trace, an unbuildable schedule, or (``strict``) an unmatched policy.

    Example:
      >>> src = from_factory("tests/data/factories.py:tiny_llama")        # doctest: +SKIP
      >>> measure(src, "minimal", "h100", rk.TrainConfig(batch=2, seq=64)).peak_bytes
    """
    t = as_target(target)
    built = source.build(policy, schedule)
    step = built.train_step(config)
    pol = built.policy
    closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
    source._cache["trace"] = checks.check_traced_with(
        closed,
        pol,
        also=_schedule_policies(built.schedule),
        previous=source._cache.get("trace"),
        what=f"{source.spec} (b{config.batch} s{config.seq})",
    )
    tags = sorted(tags_in(closed))
    if strict:
        checks.check_policy_matches(pol, tags, strict=True, where=source.spec)
    labels = {
        "model": source.spec,
        "batch": config.batch,
        "seq": config.seq,
        "optimizer": config.optimizer,
        "accum": config.accum,
        "params": int(nbytes_count(step.args[:2])),
        "tokens_per_step": config.batch * config.seq,
        # The regime casts weights and optimizer state; the compute dtype is the module's.
        "precision": {**step.precision, "compute": "module's own"},
        **(meta or {}),
    }
    if source.n_layers() is not None:
        labels["layers"] = source.n_layers()
    report = memory_report(
        step.fn,
        *step.args,
        target=t,
        donate_argnums=step.donate_argnums,
        policy=pol,
        attention="model's own",
        schedule=built.schedule.spec,
        meta=labels,
        warn=warn,
    )
    report = add_breakdown(report, step)
    if baseline:
        report = report.replace(
            meta={**report.meta, "recompute_overhead": report.flops / baseline - 1.0}
        )
    if pol.offloads:
        marked = saved_residuals(step.loss_fn, *step.loss_args, policy=pol).bytes_by("offloaded")
        note = checks.offload_shortfall(report, marked)
        if note is not None:
            if warn:
                warnings.warn(note, RematWarning, stacklevel=2)
            report = report.replace(warnings=(*report.warnings, note))
    return report


def nbytes_count(tree: Any) -> int:
    """Number of elements in a pytree of arrays or ShapeDtypeStructs (a parameter count)."""
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(tree)))


def step_flops(
    source: ModelSource, policy: Any, config: TrainConfig, schedule: Any = "none"
) -> float:
    """FLOPs of the train step of ``source`` under ``policy`` (traced, not compiled)."""
    step = source.build(policy, schedule).train_step(config)
    return float(count_flops(step.fn, *step.args).total)


def residuals(
    source: ModelSource, policy: Any, config: TrainConfig, schedule: Any = "none"
) -> ResidualReport:
    """What ``policy`` keeps for the backward pass of one micro-batch, by tag (traced).

    A name-based policy that matches no tag there is a RematWarning.
    """
    built = source.build(policy, schedule)
    step = built.train_step(config)
    report = saved_residuals(step.loss_fn, *step.loss_args, policy=built.policy)
    checks.check_policy_matches(built.policy, report.tags, where=source.spec)
    return report


def workload(
    source: ModelSource | str | Callable[..., Any],
    target: Target | str,
    config: TrainConfig,
    *,
    strict: bool = False,
    label: str | None = None,
) -> Workload:
    """The train step of a factory as an ``rk.Workload`` for ``rk.plan``, ``rk.max_batch``,
    ``rk.front`` and ``rk.advise``: one call from a factory to the search.

    ``config.batch`` is only a default: the search sets the batch. Schedules the source cannot
    build are left out of the search; per-layer splits need a known layer count.

    Args:
      source: a ModelSource, or what :func:`from_factory` takes.
      target: where to compile.
      config: sequence, optimizer, precision, accumulation (``batch`` is overridden).
      strict: a policy matching no tag is an error (the CLI), not a warning.
      label: a name for tables (default: the source's spec, seq and optimizer).

    Returns:
      The Workload.

    Example:
      >>> w = workload("my_model.py:build", "h100", rk.TrainConfig(batch=4, seq=2048))
      ...                                                                 # doctest: +SKIP
      >>> rk.plan(w, batch=4).policy.spec
    """
    src = source if isinstance(source, ModelSource) else from_factory(source)
    t = as_target(target)

    def at(batch: int) -> TrainConfig:
        return dataclasses.replace(config, batch=batch)

    n_layers = src.n_layers() if "layers" in src.schedule_kinds else None
    return Workload(
        lambda p, s, b: measure(src, p, t, at(b), schedule=s, strict=strict, warn=False),
        lambda p, s, b: step_flops(src, p, at(b), s),
        target=t,
        seq=config.seq,
        n_layers=n_layers or 1,
        batch_multiple=config.accum,
        residuals_fn=lambda p, s, b: residuals(src, p, at(max(config.accum, b)), s),
        breakdown_fn=lambda b: dict(src.build("none").train_step(at(b)).breakdown),
        label=label or f"{src.spec} s{config.seq} {config.optimizer}",
        schedule_kinds=src.schedule_kinds,
    )
