"""Preset name + policy + training options + target -> MemoryReport.

The one place that joins the model registry to remat_kit's train step and analysis;
the CLI and the experiments call it so they measure the same program.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

import remat_kit as rk
from models import build, get_config
from models.config import ModelConfig

__all__ = [
    "Options",
    "baseline_flops",
    "measure",
    "model_config",
    "options_from_args",
    "residuals",
    "resolve_attention",
    "step_breakdown",
    "step_flops",
    "workload",
]


@dataclasses.dataclass(frozen=True)
class Options:
    """What a user sets on the command line besides the policy and target.

    ``overrides`` holds model overrides (``layers``, ``width``, ...); ``lora`` is the
    LoRA rank (0: full fine-tuning). ``shard`` is a mesh plan (``"fsdp:8"``,
    ``"fsdp:4,tp:2"``; see ``rk.parse_shard``) over the target's devices: the step is
    compiled sharded and every figure is what one device holds. ``batch`` stays the global
    batch (per device: ``batch / plan.data_size``).
    """

    model: str
    batch: int
    seq: int
    optimizer: str = "adamw"
    lora: int = 0
    accum: int = 1
    param_dtype: str | None = None
    dtype: str | None = None
    attention: str = "auto"
    scan_layers: bool = True
    overrides: tuple[tuple[str, Any], ...] = ()
    shard: str | None = None

    def train_config(self) -> rk.TrainConfig:
        return rk.TrainConfig(
            batch=self.batch,
            seq=self.seq,
            optimizer=self.optimizer,
            lora=self.lora > 0,
            accum=self.accum,
        )


def options_from_args(args: Any) -> Options:
    """Options from parsed ``remat-kit`` arguments (``--model --batch --seq ...``)."""
    overrides = tuple(
        (key, getattr(args, key))
        for key in ("layers", "width", "heads", "kv_heads", "ff", "vocab", "max_seq")
        if getattr(args, key, None) is not None
    )
    return Options(
        model=args.model,
        batch=args.batch,
        seq=args.seq,
        optimizer=getattr(args, "optimizer", "adamw"),
        lora=getattr(args, "lora", 0),
        accum=getattr(args, "accum", 1),
        param_dtype=getattr(args, "param_dtype", None),
        dtype=getattr(args, "dtype", None),
        attention=getattr(args, "attention", "auto"),
        scan_layers=not getattr(args, "no_scan", False),
        overrides=overrides,
        shard=getattr(args, "shard", None),
    )


def resolve_attention(requested: str, target: rk.Target, cfg: ModelConfig | None = None) -> str:
    """``auto`` -> ``cudnn`` where flash attention compiles for ``target``, else ``xla``.

    With ``cfg``, ``auto`` also falls back to ``xla`` where cuDNN's kernel cannot serve
    the model (f32 compute, attention dropout).

    Raises:
      ValueError: ``cudnn`` asked for a target that cannot run it.
    """
    if requested == "auto":
        usable = cfg is None or (
            jax.numpy.dtype(cfg.dtype).itemsize == 2 and cfg.dropout_rate == 0.0
        )
        return "cudnn" if usable and rk.cudnn_attention_available(target) else "xla"
    if requested == "cudnn" and not rk.cudnn_attention_available(target):
        raise ValueError(
            "attention='cudnn' needs an NVIDIA target with compute capability >= 8.0 and the "
            f"cuDNN wheel (pip install 'jax[cuda12]'); {target.name} has neither: "
            "use --attention xla"
        )
    return requested


def model_config(
    opts: Options, policy: Any, target: rk.Target, schedule: Any = "none"
) -> ModelConfig:
    """The ModelConfig an Options + policy + schedule + target describe (attention resolved)."""
    extra: dict[str, Any] = dict(opts.overrides)
    if opts.param_dtype:
        extra["param_dtype"] = opts.param_dtype
    if opts.dtype:
        extra["dtype"] = opts.dtype
    cfg = get_config(
        opts.model,
        policy=policy,
        schedule=schedule,
        scan_layers=opts.scan_layers,
        attention="xla",
        lora_rank=opts.lora,
        **extra,
    )
    cfg = cfg.replace(attention=resolve_attention(opts.attention, target, cfg))
    if opts.seq > cfg.max_seq_len and cfg.family == "gpt2":
        raise ValueError(
            f"seq={opts.seq} exceeds {opts.model}'s learned positions ({cfg.max_seq_len}); "
            f"use --seq <= {cfg.max_seq_len} or --max-seq"
        )
    return cfg


def measure(
    opts: Options,
    policy: Any,
    target: rk.Target | str,
    *,
    schedule: Any = "none",
    baseline: float | None = None,
    warn: bool = False,
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

    Returns:
      The MemoryReport with its weights/gradients/optimizer/activations breakdown.
    """
    t = rk.as_target(target)
    cfg = model_config(opts, policy, t, schedule)
    pol = cfg.policy
    step = _train_step(opts, cfg, t)
    meta = {
        "model": opts.model,
        "batch": opts.batch,
        "seq": opts.seq,
        "optimizer": opts.optimizer,
        "lora": opts.lora,
        "accum": opts.accum,
        "param_dtype": jax.numpy.dtype(cfg.param_dtype).name,
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
        warn=warn,
    )
    report = rk.train.add_breakdown(report, step)
    if baseline:
        report = report.replace(
            meta={**report.meta, "recompute_overhead": report.flops / baseline - 1.0}
        )
    if pol.offloads and report.host_bytes:
        report = _with_offload_estimate(report, opts, pol, t, cfg)
    return report


def _train_step(opts: Options, cfg: ModelConfig, t: rk.Target) -> rk.train.TrainStep:
    """The train step of ``opts`` for ``cfg``, sharded over ``t``'s devices when asked."""
    if not opts.shard:
        return rk.build_train_step(build(cfg), opts.train_config())
    plan = rk.parse_shard(opts.shard, t.devices)
    return rk.build_train_step(build(cfg), opts.train_config(), sharding=plan, mesh=plan.mesh(t))


def _with_offload_estimate(
    report: rk.MemoryReport, opts: Options, pol: rk.Policy, t: rk.Target, cfg: ModelConfig
) -> rk.MemoryReport:
    # The same step with the offloaded tensors recomputed instead: traced, not compiled.
    alt = rk.build_train_step(
        build(cfg.replace(policy=rk.policies.recompute_instead(pol))), opts.train_config()
    )
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
    cfg = model_config(opts, policy, t, schedule)
    step = rk.build_train_step(build(cfg), opts.train_config())
    return rk.saved_residuals(step.loss_fn, *step.loss_args, policy=cfg.policy)


def step_flops(
    opts: Options, policy: Any, target: rk.Target | str, schedule: Any = "none"
) -> float:
    """FLOPs of the train step under ``policy`` and ``schedule`` (traced, not compiled)."""
    t = rk.as_target(target)
    cfg = model_config(opts, policy, t, schedule)
    step = rk.build_train_step(build(cfg), opts.train_config())
    return rk.count_flops(step.fn, *step.args).total


def step_breakdown(opts: Options, target: rk.Target | str) -> dict[str, int]:
    """Bytes of weights, gradients, optimizer state, batch and accumulator (from shapes).

    Per device when ``opts.shard`` is set.
    """
    t = rk.as_target(target)
    cfg = model_config(opts, "full", t)
    return dict(_train_step(opts, cfg, t).breakdown)


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
