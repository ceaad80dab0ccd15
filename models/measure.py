"""Preset name + policy + training options + target -> MemoryReport.

The one place that joins the model registry to remat_kit's train step and analysis;
the CLI and the experiments call it so they measure the same program. The options and the
model config they name are :mod:`models.options` (re-exported here, where callers look).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import warnings
from pathlib import Path
from typing import Any

import jax

import remat_kit as rk
import remat_kit.cache
import remat_kit.checks
import remat_kit.sources
from models import build
from models.config import ModelConfig
from models.options import (
    ABSURD_FACTOR,
    MAX_TOKENS,
    Options,
    check_sizes,
    cudnn_problem,
    is_factory,
    model_config,
    options_from_args,
    precision_of,
    resolve_attention,
)
from remat_kit.breakdown import add_breakdown, add_measured_breakdown
from remat_kit.errors import BadValue

__all__ = [
    "ABSURD_FACTOR",
    "MAX_TOKENS",
    "Options",
    "baseline_flops",
    "check_policies",
    "check_sizes",
    "cudnn_problem",
    "factory_step",
    "is_factory",
    "layer_count",
    "measure",
    "model_config",
    "model_source",
    "options_from_args",
    "precision_of",
    "preset_tags",
    "residuals",
    "resolve_attention",
    "step_breakdown",
    "step_flops",
    "train_step",
    "usable_policies",
    "workload",
]


def measure(
    opts: Options,
    policy: Any,
    target: rk.Target | str,
    *,
    schedule: Any = "none",
    baseline: float | None = None,
    warn: bool = False,
    measured_breakdown: bool = False,
) -> rk.MemoryReport:
    """Compiles the train step of ``opts`` under ``policy`` for ``target`` and reports it.

    Args:
      opts: model preset, batch, sequence and training options.
      policy: a policy name/spec, ``rk.Policy`` or jax policy callable.
      target: a Target or target name.
      schedule: a layer schedule (``rk.Schedule`` or spec such as ``every:2``).
      baseline: FLOPs of the same step without remat; when given, the report's meta
        holds ``recompute_overhead`` = flops / baseline - 1.
      warn: issue the report's warnings as RematWarning too.
      measured_breakdown: read the breakdown from XLA's buffer assignment (a second
        compile, with XLA's dump; unsharded steps only) instead of the shapes' estimate,
        which is kept in ``meta["breakdown_estimate"]``.

    Returns:
      The MemoryReport with its weights/gradients/optimizer/activations breakdown; its
      meta names the precision (every dtype) and the dropout rate trained with.
    """
    t = rk.as_target(target)
    if is_factory(opts):
        if measured_breakdown:
            raise BadValue(
                f"--measured-breakdown is not wired for factories ({opts.model}): drop it"
            )
        return rk.sources.measure(
            model_source(opts),
            policy,
            t,
            _factory_config(opts),
            schedule=schedule,
            baseline=baseline,
            strict=opts.strict,
            warn=warn,
        )
    cfg = model_config(opts, policy, t, schedule)
    pol = cfg.policy
    if opts.strict:
        rk.checks.check_policy_matches(pol, preset_tags(opts, t), strict=True, where=opts.model)
    if measured_breakdown and opts.shard:
        raise BadValue(
            "a measured breakdown reads one unsharded program: drop --shard, or drop "
            "--measured-breakdown for the estimate"
        )

    def compute() -> rk.MemoryReport:
        return _measure(opts, cfg, t, schedule, baseline, measured_breakdown)

    if pol.name == "custom":
        report = compute()  # a callable has no spec to remember it by
    else:
        report = _remembered(
            "report",
            opts,
            t,
            compute,
            policy=pol.spec,
            schedule=cfg.schedule.spec,
            baseline=baseline,
            measured_breakdown=measured_breakdown,
        )
    if warn:
        for note in report.warnings:
            warnings.warn(note, rk.RematWarning, stacklevel=2)
    return report


def _remembered(kind: str, opts: Options, t: rk.Target, compute: Any, **request: Any) -> Any:
    """``compute()`` remembered on disk under the request (``rk.cache.remember``): the options
    (with the Hugging Face config's contents), the code of remat_kit and models, and
    ``request``. A warm run answers without tracing; reports read back say 0 s compiling."""
    parts = {
        "options": dataclasses.asdict(opts),
        "code": rk.cache.code_fingerprint("remat_kit", "models"),
        **request,
    }
    if opts.hf_config is not None:
        parts["hf_config"] = hashlib.sha256(Path(opts.hf_config).read_bytes()).hexdigest()
    if kind == "report":
        encode = rk.MemoryReport.to_dict

        def decode(d: Any) -> rk.MemoryReport:
            return rk.MemoryReport.from_dict({**d, "compile_seconds": 0.0})

    else:
        encode = decode = lambda value: value  # JSON-ready already
    return rk.cache.remember(kind, parts, t, compute, encode=encode, decode=decode)


def _measure(
    opts: Options,
    cfg: ModelConfig,
    t: rk.Target,
    schedule: Any,
    baseline: float | None,
    measured_breakdown: bool,
) -> rk.MemoryReport:
    pol = cfg.policy
    step = train_step(opts, cfg, t)
    meta = {
        "model": opts.model,
        "batch": opts.batch,
        "seq": opts.seq,
        "optimizer": opts.optimizer,
        "lora": opts.lora,
        "accum": opts.accum,
        "param_dtype": jax.numpy.dtype(cfg.param_dtype).name,
        "precision": dict(step.precision),
        "dropout": cfg.dropout_rate,
        "layers": cfg.n_layers,
        "params": cfg.param_count(),
        "tokens_per_step": opts.batch * opts.seq,
    }
    if step.plan is not None:
        meta.update(
            mesh=step.plan.spec,
            devices=t.devices,
            hosts=t.hosts,
            batch_per_device=opts.batch // step.plan.data_size,
        )
    report = rk.memory_report(
        step.fn,
        *step.args,
        target=t,
        donate_argnums=step.donate_argnums,
        in_shardings=step.in_shardings,
        out_shardings=step.out_shardings,
        policy=pol,
        attention=cfg.attention,
        schedule=cfg.schedule.spec,
        meta=meta,
        warn=False,
    )
    if measured_breakdown:
        report = add_measured_breakdown(report, step, t)
    else:
        report = add_breakdown(report, step)
    if baseline:
        report = report.replace(
            meta={**report.meta, "recompute_overhead": report.flops / baseline - 1.0}
        )
    if pol.offloads and report.host_bytes:
        report = _with_offload_estimate(report, opts, pol, t, cfg)
    if pol.offloads and not opts.shard:
        # XLA may carry out only part of the copies jax marks (unrolled layers): say so. Both
        # figures are one micro-batch's on one device (sharded steps are not compared).
        marked = residuals(opts, pol, t, schedule).bytes_by("offloaded")
        note = rk.checks.offload_shortfall(report, marked)
        if note is not None:
            report = report.replace(warnings=(*report.warnings, note))
    return report


def train_step(
    opts: Options, cfg: ModelConfig, t: rk.Target, *, sharded: bool = True
) -> rk.train.TrainStep:
    """The train step of ``opts`` for ``cfg``, as the measured programs run it.

    In train mode: where ``cfg.dropout_rate`` > 0 the model applies dropout and the step
    takes a dropout key (``rng_streams=("dropout",)``). Sharded over ``t``'s devices when
    ``opts.shard`` is set and ``sharded``.

    Args:
      opts: the options (precision, batch, optimizer, ...).
      cfg: the model config (:func:`model_config`).
      t: the target.
      sharded: False builds the unsharded step even with ``opts.shard``.

    Returns:
      The ``rk.train.TrainStep``.

    Example:
      >>> t = rk.target("h100")
      >>> opts = Options("tiny-gpt2", 2, 64, dropout=0.1)
      >>> train_step(opts, model_config(opts, "full", t), t).rng_streams
      ('dropout',)
    """
    dropout = cfg.dropout_rate > 0.0
    module = build(cfg, deterministic=not dropout)
    streams = ("dropout",) if dropout else ()
    config = opts.train_config()
    params = _abstract_params(
        cfg.replace(policy="none", schedule="none"), config.micro_batch, config.seq
    )
    if not (opts.shard and sharded):
        return rk.build_train_step(module, config, rng_streams=streams, abstract_params=params)
    plan = rk.parse_shard(opts.shard, t.devices)
    return rk.build_train_step(
        module,
        config,
        sharding=plan,
        mesh=plan.mesh(t),
        rng_streams=streams,
        abstract_params=params,
    )


@functools.cache
def _abstract_params(cfg: ModelConfig, micro_batch: int, seq: int) -> Any:
    """The abstract (boxed) variables of ``cfg``'s model, traced once per model: the policy
    and the schedule do not change how a preset lays out its parameters (tested), so
    ``cfg`` comes with both at ``none`` and every step built for the search shares them."""
    module = build(cfg)
    tokens = jax.ShapeDtypeStruct((micro_batch, seq), jax.numpy.int32)
    return jax.eval_shape(module.init, jax.random.key(0), tokens)


def _with_offload_estimate(
    report: rk.MemoryReport, opts: Options, pol: rk.Policy, t: rk.Target, cfg: ModelConfig
) -> rk.MemoryReport:
    # The same step with the offloaded tensors recomputed instead: traced, not compiled.
    alt = train_step(opts, cfg.replace(policy=rk.policies.recompute_instead(pol)), t, sharded=False)
    extra = rk.count_flops(alt.fn, *alt.args).total - report.flops
    est = rk.analysis.transfer_estimate(report, t, max(extra, 0.0))
    if est is None:
        return report
    notes = list(report.warnings)
    if est.link_bound:
        notes.append(
            f"offloading {est.host_bytes / 2**30:.1f} GiB per step needs an estimated "
            f"{est.transfer_seconds * 1e3:.0f} ms on {t.name}'s host link, more than the "
            f"step's {est.step_compute_seconds * 1e3:.0f} ms of compute: it cannot hide "
            "behind compute"
        )
    return report.replace(
        meta={**report.meta, "offload_estimate": est._asdict()}, warnings=tuple(notes)
    )


def baseline_flops(opts: Options, target: rk.Target | str) -> float:
    """FLOPs of the train step without rematerialization (traced, not compiled)."""
    return step_flops(opts, "none", target)


def residuals(
    opts: Options, policy: Any, target: rk.Target | str, schedule: Any = "none"
) -> rk.residuals.ResidualReport:
    """What ``policy`` keeps for the backward pass of one micro-batch, by tag."""
    t = rk.as_target(target)
    if is_factory(opts):
        return rk.sources.residuals(model_source(opts), policy, _factory_config(opts), schedule)
    cfg = model_config(opts, policy, t, schedule)
    step = train_step(opts, cfg, t, sharded=False)
    return rk.saved_residuals(step.loss_fn, *step.loss_args, policy=cfg.policy)


def step_flops(
    opts: Options, policy: Any, target: rk.Target | str, schedule: Any = "none"
) -> float:
    """FLOPs of the train step under ``policy`` and ``schedule`` (traced, not compiled)."""
    t = rk.as_target(target)
    if is_factory(opts):
        return rk.sources.step_flops(model_source(opts), policy, _factory_config(opts), schedule)
    cfg = model_config(opts, policy, t, schedule)

    def compute() -> float:
        step = train_step(opts, cfg, t, sharded=False)
        return float(rk.count_flops(step.fn, *step.args).total)

    if cfg.policy.name == "custom":
        return compute()
    return _remembered(
        "flops", opts, t, compute, policy=cfg.policy.spec, schedule=cfg.schedule.spec
    )


def step_breakdown(opts: Options, target: rk.Target | str) -> dict[str, int]:
    """Bytes of weights, gradients, optimizer state, batch and accumulator (from shapes).

    Per device when ``opts.shard`` is set.
    """
    t = rk.as_target(target)
    if is_factory(opts):
        step = model_source(opts).build("none").train_step(_factory_config(opts))
        return dict(step.breakdown)
    cfg = model_config(opts, "full", t)
    return dict(train_step(opts, cfg, t).breakdown)


def workload(opts: Options, target: rk.Target | str) -> rk.Workload:
    """The train step of ``opts`` as an ``rk.Workload`` for the search (any batch size).

    ``opts.batch`` is only a default: the search sets the batch. Reports, FLOPs and residuals
    are cached in the returned object.

    Example:
      >>> import remat_kit as rk                                           # doctest: +SKIP
      >>> w = workload(Options("llama3-8b", batch=4, seq=2048, optimizer="sgd"), "h100")
      >>> rk.max_batch(w, "full").max_batch
    """
    t = rk.as_target(target)
    if is_factory(opts):
        return rk.sources.workload(model_source(opts), t, _factory_config(opts), strict=opts.strict)
    cfg = model_config(opts, "none", t)  # validates the options before any search
    # Under a mesh plan the global batch is a multiple of the data-parallel ways.
    ways = rk.parse_shard(opts.shard, t.devices).data_size if opts.shard else 1

    def at(batch: int) -> Options:
        return dataclasses.replace(opts, batch=batch)

    def measure_fn(policy: rk.Policy, schedule: rk.Schedule, batch: int) -> rk.MemoryReport:
        return measure(at(batch), policy, t, schedule=schedule)

    def flops_fn(policy: rk.Policy, schedule: rk.Schedule, batch: int) -> float:
        return step_flops(at(batch), policy, t, schedule)

    def residuals_fn(
        policy: rk.Policy, schedule: rk.Schedule, batch: int
    ) -> rk.residuals.ResidualReport:
        # The planner sizes what one GPU keeps: under data parallelism that is the residuals
        # of the per-device share of the batch (tp splits them further; compiles verify).
        per_device = dataclasses.replace(at(max(opts.accum, batch // ways)), shard=None)
        return residuals(per_device, policy, t, schedule)

    label = (
        f"{opts.model} s{opts.seq} {opts.optimizer}"
        + (f" lora{opts.lora}" if opts.lora else "")
        + (f" {rk.parse_shard(opts.shard, t.devices).spec}" if opts.shard else "")
    )
    return rk.Workload(
        measure_fn,
        flops_fn,
        target=t,
        seq=opts.seq,
        n_layers=cfg.n_layers,
        batch_multiple=opts.accum * ways,
        residuals_fn=residuals_fn,
        breakdown_fn=lambda batch: step_breakdown(at(batch), t),
        label=label,
    )


# Model sources: a preset, a Hugging Face config.json (our decoder), or a factory.


@functools.cache
def _source(model: str, block: str | None, tags: str) -> rk.sources.ModelSource:
    return rk.sources.from_factory(model, block=block, tags=None if tags == "none" else tags)


def model_source(opts: Options) -> rk.sources.ModelSource:
    """The factory ``opts.model`` names (loaded once per process), checked against the options.

    Raises:
      BadValue: an option a factory's model does not take (``--lora``, the shape overrides,
        ``--attention``, ``--dropout``, ``--shard``), or a factory that cannot be loaded.
    """
    given = {
        "--lora": opts.lora,
        "--layers/--width/--heads/...": opts.overrides,
        "--attention": opts.attention != "auto",
        "--dropout": opts.dropout is not None,
        "--shard": opts.shard,
        "--no-scan": not opts.scan_layers,
    }
    bad = [flag for flag, value in given.items() if value]
    if bad:
        raise BadValue(
            f"{', '.join(bad)}: the factory {opts.model} builds its own model (adapters, "
            "shape, attention, dropout, layer loop and sharding are its own): drop them"
        )
    return _source(opts.model, opts.block, opts.tags)


def _factory_config(opts: Options) -> rk.TrainConfig:
    return opts.train_config()


def layer_count(opts: Options, target: rk.Target | str) -> int:
    """Layers of the model ``opts`` names (a factory's when it can be counted, else 1)."""
    if is_factory(opts):
        return model_source(opts).n_layers() or 1
    return model_config(opts, "full", rk.as_target(target)).n_layers


@functools.cache
def _preset_tags(opts: Options, target: rk.Target) -> tuple[str, ...]:
    def compute() -> list[str]:
        cfg = model_config(opts, "none", target)
        step = train_step(opts, cfg, target, sharded=False)
        return sorted(rk.residuals.tags_in(jax.make_jaxpr(step.loss_fn)(*step.loss_args)))

    return tuple(_remembered("tags", opts, target, compute))


def preset_tags(opts: Options, target: rk.Target | str) -> tuple[str, ...]:
    """The checkpoint-name tags of the model's step (any source); traced once, cached.

    Tags do not depend on the policy or the batch: one micro-batch of one sequence is traced
    under ``none`` (a factory's model tagged as it will be measured).
    """
    small = dataclasses.replace(opts, batch=max(1, opts.accum), shard=None)
    if is_factory(small):
        return _factory_tags(small)
    return _preset_tags(small, rk.as_target(target))


@functools.cache
def _factory_tags(opts: Options) -> tuple[str, ...]:
    step = model_source(opts).build("none").train_step(_factory_config(opts))
    return tuple(sorted(rk.residuals.tags_in(jax.make_jaxpr(step.loss_fn)(*step.loss_args))))


def usable_policies(
    opts: Options, target: rk.Target | str, policies: Any, *, given: bool
) -> tuple[list[rk.Policy], list[str]]:
    """The policies that can act on the model, and the specs of those that cannot.

    Args:
      opts: the options (any model source).
      target: the target.
      policies: policy names, specs or Policies.
      given: the user named them: a policy matching no tag is then an error, not skipped.

    Returns:
      (kept policies, skipped specs).

    Raises:
      BadValue: ``given`` and a name-based policy that matches no tag of the model.
    """
    pols = [rk.as_policy(p) for p in policies]
    if given or not any(p.tags for p in pols):
        check_policies(opts, target, pols)
        return pols, []
    tags = preset_tags(opts, target)
    skipped = [p.spec for p in pols if rk.checks.unmatched_policy(p, tags)]
    return [p for p in pols if p.spec not in skipped], skipped


def check_policies(opts: Options, target: rk.Target | str, policies: Any) -> None:
    """Before any compile: every name-based policy must match a tag of the model.

    Args:
      opts: the options (any model source).
      target: the target (the attention kernel, hence the tags, may depend on it).
      policies: policy names, specs or Policies.

    Raises:
      BadValue: the first policy that matches no tag (one line listing the tags there).
    """
    pols = [rk.as_policy(p) for p in policies]
    if not any(p.tags for p in pols):
        return
    tags = preset_tags(opts, target)
    for p in pols:
        rk.checks.check_policy_matches(p, tags, strict=True, where=opts.model)


def factory_step(opts: Options, policy: Any, schedule: Any = "none") -> rk.train.TrainStep:
    """The train step of a factory's model under ``policy``, its trace checked first.

    The program must carry ``policy`` (not a stale or ignored trace) and, with
    ``opts.strict``, a name-based policy must match one of its tags.

    Raises:
      BadValue: a stale trace, an unbuildable schedule or (strict) an unmatched policy.
    """
    src = model_source(opts)
    built = src.build(policy, schedule)
    step = built.train_step(_factory_config(opts))
    closed = jax.make_jaxpr(step.loss_fn)(*step.loss_args)
    rk.checks.check_traced_with(closed, built.policy, what=src.spec)
    tags = rk.residuals.tags_in(closed)
    rk.checks.check_policy_matches(built.policy, tags, strict=opts.strict, where=src.spec)
    return step
