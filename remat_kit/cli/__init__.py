"""``remat-kit``: memory reports for a named GPU from the command line.

Subcommands: ``report`` (one policy, with its breakdown and saved residuals),
``compare`` (a table over policies), ``fit`` (largest batch), ``plan`` (cheapest plan under
a budget, Pareto front), ``advise`` (which GPU), ``targets``, ``policies``, ``models``. Every
figure comes from a compiled program (see remat_kit.analysis); this module only
parses arguments and renders reports.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from remat_kit.cli._args import (
    Parser,
    add_model_args,
    add_search_args,
    non_negative_int,
    positive_int,
)
from remat_kit.search import FRONT_POLICIES

__all__ = ["MAIN_POLICIES", "main"]

#: What ``compare`` measures when no ``--policies`` is given.
MAIN_POLICIES = FRONT_POLICIES

_GIB = 2**30


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="remat-kit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    rep = sub.add_parser("report", help="peak HBM of one policy, with breakdown and residuals")
    add_model_args(rep)
    rep.add_argument("--policy", default="full", help="policy name or spec")
    rep.add_argument(
        "--schedule", default="none", help="none | every:K | sqrt | nested:M | layers:0-7=full,..."
    )
    rep.add_argument("--no-residuals", action="store_true", help="skip the residual table")
    cmp_ = sub.add_parser("compare", help="a table of policies for one model and target")
    add_model_args(cmp_)
    cmp_.add_argument(
        "--policies", default=",".join(MAIN_POLICIES), help="comma-separated names or specs"
    )
    cmp_.add_argument(
        "--schedules",
        "--schedule",
        default="none",
        help="comma-free list separated by ';' or spaces, e.g. 'none;every:2;sqrt'",
    )
    cmp_.add_argument("--csv", type=Path, default=None, help="write the rows as CSV")
    fit = sub.add_parser("fit", help="the largest batch that fits, per policy")
    add_model_args(fit)
    fit.add_argument("--policy", default=None, help="one policy (name or spec)")
    fit.add_argument(
        "--policies",
        default="none,full,minimal,plan",
        help="comma-separated policies; 'plan' is the planner at the largest batch",
    )
    fit.add_argument("--schedule", default="none", help="layer schedule for every policy")
    add_search_args(fit)
    pln = sub.add_parser("plan", help="the cheapest plan whose compiled peak fits a budget")
    add_model_args(pln)
    pln.add_argument(
        "--budget", default=None, help="52GiB, 40GB or 0.8 (of the device); default: device"
    )
    pln.add_argument(
        "--policies",
        default=",".join(MAIN_POLICIES),
        help="catalogue policies compiled beside the plan ('' for none)",
    )
    pln.add_argument("--plot", type=Path, default=None, help="write the Pareto front as PNG")
    add_search_args(pln)
    adv = sub.add_parser("advise", help="for every GPU: does it fit, with which plan")
    add_model_args(adv)
    adv.add_argument("--targets", default=None, help="comma-separated targets (default: all GPUs)")
    adv.add_argument(
        "--scale-out",
        action="store_true",
        help="where one GPU cannot fit, find how many GPUs of that kind fit with fsdp + full",
    )
    add_search_args(adv)
    from remat_kit.inspect import add_inspect_parser

    add_inspect_parser(sub, add_model_args)
    sub.add_parser("targets", help="list the GPU targets")
    sub.add_parser("policies", help="list the policies")
    sub.add_parser("models", help="list the model presets")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``remat-kit``; returns the exit code.

    Example:
      >>> main(["policies"])  # doctest: +SKIP
    """
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (ValueError, TypeError) as err:
        sys.stderr.write(f"remat-kit: {err}\n")
        return 2
    except RuntimeError as err:
        from remat_kit.targets import TargetError

        if isinstance(err, TargetError):
            sys.stderr.write(f"remat-kit: {err}\n")
            return 2
        raise


def _run(args: argparse.Namespace) -> int:
    import remat_kit as rk

    if getattr(args, "target", None) != "local":
        # Deviceless compiles need jax's CPU platform, chosen before its backends start.
        rk.configure_for_deviceless()
    if args.command == "targets":
        return _list_targets(rk)
    if args.command == "policies":
        return _list_policies(rk)
    if args.command == "models":
        return _list_models()
    if args.command == "inspect":
        from remat_kit.inspect import run_inspect

        return run_inspect(args, rk)
    if args.command == "report":
        return _report(args, rk)
    if args.command == "fit":
        return _fit(args, rk)
    if args.command == "plan":
        return _plan(args, rk)
    if args.command == "advise":
        return _advise(args, rk)
    return _compare(args, rk)


def _console() -> Any:
    from rich.console import Console

    return Console(width=max(150, min(200, _terminal_width())))


def _terminal_width() -> int:
    try:
        return os.get_terminal_size().columns
    except OSError:
        return 120


def _list_targets(rk: Any) -> int:
    from rich.table import Table

    table = Table(title="targets")
    for col in ("name", "device", "memory GiB", "HBM TB/s", "host link GB/s", "bf16 TFLOP/s"):
        table.add_column(col)
    for name in rk.target_names():
        t = rk.target(name)
        table.add_row(
            name,
            t.description,
            _fmt(t.memory_bytes, _GIB),
            _fmt(t.hbm_bandwidth, 1e12),
            _fmt(t.host_link_bandwidth, 1e9, 0),
            _fmt(t.peak_bf16_flops, 1e12, 0),
        )
    _console().print(table)
    return 0


def _list_policies(rk: Any) -> int:
    from rich.table import Table

    table = Table(title="policies (rk.policy(name) / --policy NAME or NAME:key=a+b)")
    table.add_column("name")
    table.add_column("what it keeps")
    examples = {
        "names": "names:save=query_proj+mlpwo",
        "except": "except:names=attn_scores+attn_probs",
        "offload": "offload:offload=context,save=query_proj",
        "either": "either:a=qkv_proj,b=context",
    }
    for name in rk.policy_names():
        if name in examples:
            p = rk.parse_policy(examples[name])
            table.add_row(f"{name}  (e.g. {examples[name]})", p.description)
        else:
            table.add_row(name, rk.policy(name).description)
    _console().print(table)
    return 0


def _list_models() -> int:
    from rich.table import Table

    import models

    table = Table(title="model presets (override with --layers/--width/--heads/--ff/--vocab)")
    for col in ("name", "family", "params", "layers", "d_model", "heads/kv", "d_ff", "vocab"):
        table.add_column(col)
    for name in models.preset_names():
        c = models.get_config(name)
        table.add_row(
            name,
            c.family,
            f"{c.param_count() / 1e9:.2f} B",
            str(c.n_layers),
            str(c.d_model),
            f"{c.n_heads}/{c.n_kv_heads}",
            str(c.d_ff),
            str(c.vocab_size),
        )
    _console().print(table)
    return 0


def _options(args: argparse.Namespace) -> Any:
    from models.measure import options_from_args

    return options_from_args(args)


def _report(args: argparse.Namespace, rk: Any) -> int:
    from models.measure import baseline_flops, measure, residuals

    opts = _options(args)
    target = rk.target(args.target, devices=args.gpus, hosts=args.hosts)
    policy = rk.as_policy(args.policy)
    schedule = rk.parse_schedule(args.schedule)
    baseline = baseline_flops(opts, target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = measure(opts, policy, target, schedule=schedule, baseline=baseline)
    res = None if args.no_residuals else residuals(opts, policy, target, schedule)
    console = _console()
    console.print(_report_table(report, target))
    if res is not None:
        console.print(_residual_table(res, report))
    for note in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {note}")
    if args.json:
        out = report.to_dict()
        if res is not None:
            out["residuals"] = res.to_dict()
        _write_json(args.json, out)
    return 0


def _compare(args: argparse.Namespace, rk: Any) -> int:
    from rich.progress import Progress

    from models.measure import baseline_flops, measure

    opts = _options(args)
    target = rk.target(args.target, devices=args.gpus, hosts=args.hosts)
    specs = [s.strip() for s in args.policies.split(",") if s.strip()]
    if not specs:
        raise ValueError("--policies is empty; give names such as none,full,minimal")
    policies = [rk.as_policy(s) for s in specs]  # fail on a bad name before compiling
    schedules = [rk.parse_schedule(s) for s in args.schedules.replace(";", " ").split()]
    if not schedules:
        raise ValueError("--schedules is empty; give e.g. 'none;every:2;sqrt'")
    cases = [(p, s) for s in schedules for p in policies]
    start = time.perf_counter()
    baseline = baseline_flops(opts, target)
    reports = []
    with Progress(transient=True) as progress:
        task = progress.add_task(f"compiling for {target.name}", total=len(cases))
        for p, sch in cases:
            label = p.spec if sch.name == "none" else f"{p.spec} @ {sch.spec}"
            progress.update(task, description=f"compiling {label} for {target.name}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                reports.append(measure(opts, p, target, schedule=sch, baseline=baseline))
            progress.advance(task)
    total = time.perf_counter() - start
    rows = compare_rows(reports)
    console = _console()
    console.print(_compare_table(rows, target, opts, total))
    for r in reports:
        # Not fitting and XLA's own remat are in the table's fits column already.
        for note in r.warnings:
            if not note.startswith(("does not fit", "XLA's own")):
                console.print(f"[yellow]{r.policy}:[/yellow] {note}")
    if args.json:
        _write_json(args.json, rows)
    if args.csv:
        _write_csv(args.csv, rows)
    return 0


def _specs(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _fit(args: argparse.Namespace, rk: Any) -> int:
    from rich.table import Table

    from models.measure import workload

    opts = _options(args)
    target = rk.target(args.target, devices=args.gpus, hosts=args.hosts)
    specs = [args.policy] if args.policy else _specs(args.policies)
    if not specs:
        raise ValueError("--policies is empty; give names such as none,full,minimal,plan")
    policies = {s: None if s == "plan" else rk.as_policy(s) for s in specs}  # fail early
    schedule = rk.parse_schedule(args.schedule)
    w = workload(opts, target)
    start = time.perf_counter()
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tables show what matters
        for pol in policies.values():
            if pol is None:
                fit, _ = rk.max_batch_plan(
                    w,
                    headroom=args.headroom,
                    start=opts.batch,
                    offload=not args.no_offload,
                    hide=args.hide,
                )
                label = f"plan: {_label(fit.policy, fit.schedule)}" if fit.fits else "plan"
            else:
                fit = rk.max_batch(w, pol, schedule, headroom=args.headroom, start=opts.batch)
                label = _label(fit.policy, fit.schedule)
            rows.append({"label": label, **fit.to_dict()})
    total = time.perf_counter() - start
    title = (
        f"largest batch: {opts.model} s{opts.seq} {opts.optimizer} on {target.name} "
        f"(limit {_fmt(rows[0]['limit_bytes'], _GIB)} GiB = device - {100 * args.headroom:.0f}%)"
    )
    table = Table(title=title, caption=f"{w.compiles} compiles in {total:.1f} s")
    for col in ("policy", "max batch", "peak GiB", "next batch GiB", "recompute", "tokens/step"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for row in rows:
        table.add_row(
            _short(row["label"]),
            str(row["max_batch"]),
            _fmt(row["peak_bytes"], _GIB),
            _fmt(row["next_peak_bytes"], _GIB),
            _pct(row["recompute_overhead"]),
            str(row["tokens_per_step"]),
        )
    console = _console()
    console.print(table)
    for row in rows:
        if not row["fits"] or row["label"].startswith("plan"):
            console.print(row["message"])
    if args.json:
        _write_json(args.json, {"seconds": total, "compiles": w.compiles, "rows": rows})
    return 0


def _plan(args: argparse.Namespace, rk: Any) -> int:
    from models.measure import workload

    opts = _options(args)
    target = rk.target(args.target, devices=args.gpus, hosts=args.hosts)
    budget = None if args.budget is None else rk.parse_budget(args.budget, target.memory_bytes)
    catalogue = [rk.as_policy(s) for s in _specs(args.policies)]  # fail early on a bad name
    w = workload(opts, target)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tables show what matters
        p = rk.plan(
            w,
            opts.batch,
            budget,
            headroom=args.headroom,
            offload=not args.no_offload,
            hide=args.hide,
            extra=catalogue,
        )
        plan_seconds = time.perf_counter() - start
        points = rk.front(
            w, opts.batch, policies=catalogue, schedules=(), plans=[p], hide=args.hide
        )
        if args.plot:
            extra_plans = _sweep_plans(rk, w, opts.batch, p, points, args)
            sched = rk.front(w, opts.batch, policies=(), plans=extra_plans, hide=args.hide)
            points = rk.pareto_front([*points, *sched])
    total = time.perf_counter() - start
    console = _console()
    console.print(_plan_table(p, points, target, opts, plan_seconds, total, w.compiles))
    console.print(_decision_table(p))
    if not p.fits:
        sys.stderr.write(f"remat-kit: {p.message}\n")
    else:
        console.print(p.message)
        console.print(
            "use it: models.get_config(..., policy=plan.policy, schedule=plan.schedule) or "
            f"--policy '{p.policy.spec}'"
            + (f" --schedule '{p.schedule.spec}'" if p.schedule.name != "none" else "")
        )
    if args.plot:
        rk.plot_front(
            points,
            args.plot,
            title=f"{opts.model} b{opts.batch} s{opts.seq} {opts.optimizer} on {target.name}",
            budget_bytes=p.budget_bytes,
            device_bytes=target.memory_bytes,
        )
    if args.json:
        _write_json(
            args.json,
            {
                "plan": p.to_dict(),
                "front": [dataclasses.asdict(pt) for pt in points],
                "plan_seconds": plan_seconds,
                "seconds": total,
            },
        )
    return 0 if p.fits else 1


def _sweep_plans(rk: Any, w: Any, batch: int, p: Any, points: Any, args: Any) -> list[Any]:
    """Plans at the peaks of the catalogue points that fit: the planner's own curve."""
    budgets = sorted(
        {pt.peak_bytes for pt in points if pt.kind == "catalogue" and pt.fits} - {p.budget_bytes}
    )
    plans = []
    for b in budgets[:4]:
        got = rk.plan(w, batch, b, offload=not args.no_offload, hide=args.hide)
        if got.fits:
            plans.append(got)
    return plans


def _plan_table(
    p: Any, points: Any, target: Any, opts: Any, plan_s: float, total: float, compiles: int
) -> Any:
    from rich.table import Table

    title = (
        f"plan for {opts.model} b{opts.batch} s{opts.seq} {opts.optimizer} on {target.name}: "
        f"budget {_fmt(p.budget_bytes, _GIB)} GiB, attention="
        f"{p.report.attention if p.report is not None else '-'}"
    )
    caption = (
        f"plan found in {plan_s:.1f} s ({p.compiles} compiles); {compiles} compiles in "
        f"{total:.1f} s in all. overhead = recompute FLOPs + host transfer not hidden "
        "(estimate); * = on the Pareto front"
    )
    table = Table(title=title, caption=caption)
    for col in ("what", "peak GiB", "recompute", "overhead", "host GiB", "fits budget", "front"):
        table.add_column(col, justify="left" if col == "what" else "right")
    main = f"plan {p.budget_bytes / _GIB:.2f} GiB"
    for pt in sorted(points, key=lambda q: (q.label != main, q.kind, q.peak_bytes)):
        if pt.label == main:
            label = f"PLAN: {p.label}"
        elif pt.kind == "plan":
            label = f"{pt.label} (plan at that budget)"
        else:
            label = pt.label
        fits = pt.peak_bytes <= p.budget_bytes
        table.add_row(
            _short(label),
            _fmt(pt.peak_bytes, _GIB),
            _pct(pt.recompute_overhead),
            _pct(pt.overhead),
            _fmt(p.host_bytes if pt.label == main else None, _GIB),
            "[green]yes[/green]" if fits else "[red]no[/red]",
            "*" if not pt.dominated else f"dominated by {_short(pt.dominated_by or '', 30)}",
        )
    return table


def _decision_table(p: Any) -> Any:
    from rich.table import Table

    table = Table(title="the plan, per tag")
    table.add_column("tag")
    table.add_column("decision")
    if p.layers:
        table.add_column(f"layers 0-{p.layers - 1}")
    for tag, decision in p.decisions.items():
        cells = [tag, decision]
        if p.layers:
            cells.append(p.layer_decisions.get(tag, decision))
        table.add_row(*cells)
    return table


def _scale_out(args: argparse.Namespace, rk: Any, opts: Any, rows: Sequence[Any]) -> dict:
    """For each target one GPU cannot serve: the fewest GPUs that fit with fsdp + full."""
    from models.measure import workload

    def workload_for(name: str) -> Any:
        def build(n: int) -> Any:
            # 8 GPUs per host, as in the DGX/HGX machines these cards come in.
            hosts = max(1, n // 8)
            shard = f"fsdp:{n}" if n > 1 else None
            return workload(
                dataclasses.replace(opts, shard=shard), rk.target(name, devices=n, hosts=hosts)
            )

        return build

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in rows:
            if not a.fits:
                out[a.target] = rk.gpus_needed(
                    workload_for(a.target),
                    opts.batch,
                    counts=(2, 4, 8, 16, 32, 64),
                    headroom=args.headroom,
                )
    return out


def _advise(args: argparse.Namespace, rk: Any) -> int:
    from rich.table import Table

    from models.measure import workload

    opts = _options(args)
    names = None if args.targets is None else _specs(args.targets)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tables show what matters
        rows = rk.advise(
            lambda t: workload(opts, rk.target(t.name, devices=args.gpus, hosts=args.hosts)),
            opts.batch,
            targets=names,
            headroom=args.headroom,
            offload=not args.no_offload,
            hide=args.hide,
        )
    total = time.perf_counter() - start
    table = Table(
        title=f"which GPU: {opts.model} b{opts.batch} s{opts.seq} {opts.optimizer}",
        caption=(
            f"{total:.1f} s. fits = the plan's compiled peak <= device - "
            f"{100 * args.headroom:.0f}%; max batch with 'full'"
        ),
    )
    for col in ("target", "GiB", "fixed GiB", "fits", "plan", "peak GiB", "recompute", "max batch"):
        table.add_column(col, justify="left" if col in ("target", "plan") else "right")
    for a in rows:
        table.add_row(
            a.target,
            _fmt(a.memory_bytes, _GIB, 0),
            _fmt(a.fixed_bytes, _GIB),
            "[green]yes[/green]" if a.fits else "[red]no[/red]",
            _short(a.plan or "-"),
            _fmt(a.peak_bytes, _GIB),
            _pct(a.recompute_overhead),
            str(a.max_batch),
        )
    console = _console()
    console.print(table)
    scale = _scale_out(args, rk, opts, rows) if args.scale_out else {}
    for a in rows:
        if not a.fits:
            console.print(f"{a.target}: {a.message}")
            if a.target in scale:
                console.print(f"  [bold]scale out:[/bold] {scale[a.target].message}")
    if args.json:
        _write_json(
            args.json,
            [
                {
                    **a.to_dict(),
                    "scale_out": scale[a.target].to_dict() if a.target in scale else None,
                }
                for a in rows
            ],
        )
    return 0


def _label(policy: str, schedule: str) -> str:
    return policy if schedule in ("none", "") else f"{policy} @ {schedule}"


def _short(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def compare_rows(reports: Sequence[Any]) -> list[dict[str, Any]]:
    """Flat rows of a comparison: the report fields plus savings against ``none``.

    ``saved_vs_none`` is 1 - peak/peak(none) when ``none`` is among the reports.
    """
    base = next((r for r in reports if r.policy == "none" and r.schedule == "none"), None)
    rows = []
    for r in reports:
        est = r.meta.get("offload_estimate") or {}
        row = {
            "policy": r.policy,
            "schedule": r.schedule,
            "attention": r.attention,
            "target": r.target,
            "peak_bytes": r.peak_bytes,
            "argument_bytes": r.argument_bytes,
            "output_bytes": r.output_bytes,
            "temp_bytes": r.temp_bytes,
            "alias_bytes": r.alias_bytes,
            "host_bytes": r.host_bytes,
            "xla_peak_bytes": r.xla_peak_bytes,
            "activation_bytes": r.breakdown.get("activations"),
            "flops": r.flops,
            "recompute_overhead": r.meta.get("recompute_overhead"),
            "saved_vs_none": (1 - r.peak_bytes / base.peak_bytes) if base else None,
            "fits": r.fits,
            "xla_remat": r.xla_remat,
            "compile_seconds": r.compile_seconds,
            "offload_transfer_seconds_est": est.get("transfer_seconds"),
            "offload_recompute_seconds_est": est.get("recompute_seconds"),
            "step_compute_seconds_est": est.get("step_compute_seconds"),
            **{
                f"meta_{k}": v
                for k, v in r.meta.items()
                if k not in ("recompute_overhead", "offload_estimate")
            },
            **{f"{k}_bytes": v for k, v in r.breakdown.items() if k != "activations"},
        }
        rows.append(row)
    return rows


def _compare_table(rows: list[dict[str, Any]], target: Any, opts: Any, total: float) -> Any:
    from rich.table import Table

    r0 = rows[0]
    title = (
        f"{opts.model} b{opts.batch} s{opts.seq} {opts.optimizer}"
        + (f" lora{opts.lora}" if opts.lora else "")
        + (f" accum{opts.accum}" if opts.accum > 1 else "")
        + (f" {opts.shard} over {target.devices} GPUs, per GPU" if opts.shard else "")
        + f" on {target.name} ({_fmt(target.memory_bytes, _GIB)} GiB), attention={r0['attention']}"
    )
    caption = f"compiled {len(rows)} programs in {total:.1f} s"
    if any(row["xla_remat"] for row in rows):
        caption += (
            "; (XLA remat): XLA's own rematerialization pass stepped in because the program "
            "came near the device memory, so that figure includes XLA's choices"
        )
    table = Table(title=title, caption=caption)
    offload = any(row["offload_transfer_seconds_est"] for row in rows)
    columns = ["policy", "peak GiB", "activations GiB", "host GiB", "saved vs none", "recompute"]
    if offload:
        columns.append("offload/recompute ms (est.)")
    columns += ["fits", "compile s"]
    for col in columns:
        table.add_column(
            col, justify="left" if col == "policy" else "right", no_wrap=col == "policy"
        )
    for row in rows:
        fits = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "-"}[row["fits"]]
        if row["xla_remat"]:
            fits += " (XLA remat)"
        name = row["policy"]
        if row["schedule"] not in (None, "none"):
            name += f" @ {row['schedule']}"
        cells = [
            name,
            _fmt(row["peak_bytes"], _GIB),
            _fmt(row["activation_bytes"], _GIB),
            _fmt(row["host_bytes"], _GIB),
            _pct(row["saved_vs_none"]),
            _pct(row["recompute_overhead"]),
        ]
        if offload:
            t_ms = row["offload_transfer_seconds_est"]
            r_ms = row["offload_recompute_seconds_est"]
            cells.append("-" if t_ms is None else f"{t_ms * 1e3:.0f} vs recompute {r_ms * 1e3:.0f}")
        table.add_row(*cells, fits, f"{row['compile_seconds']:.1f}")
    return table


def _report_table(r: Any, target: Any) -> Any:
    from rich.table import Table

    m = r.meta
    title = (
        f"{m.get('model')} b{m.get('batch')} s{m.get('seq')} {m.get('optimizer')} "
        f"policy={r.policy} schedule={r.schedule} attention={r.attention} on {target.name}"
    )
    table = Table(title=title, show_header=True)
    table.add_column("what")
    table.add_column("GiB", justify="right")
    rows = [
        ("peak (argument + output + temp - alias)", r.peak_bytes),
        ("  weights", r.breakdown.get("weights")),
        ("  gradients", r.breakdown.get("gradients")),
        ("  optimizer state", r.breakdown.get("optimizer")),
        ("  gradient accumulator", r.breakdown.get("grad_accumulator")),
        ("  batch", r.breakdown.get("batch")),
        ("  activations and temporaries", r.breakdown.get("activations")),
        ("XLA argument / output / temp / alias", None),
        ("  argument", r.argument_bytes),
        ("  output", r.output_bytes),
        ("  temp", r.temp_bytes),
        ("  alias", r.alias_bytes),
        ("host (offloaded, pinned host memory)", r.host_bytes),
        ("XLA's own peak", r.xla_peak_bytes),
        ("target memory", target.memory_bytes),
    ]
    for label, value in rows:
        table.add_row(label, "" if value is None else _fmt(value, _GIB))
    fits = {True: "yes", False: "NO", None: "-"}[r.fits]
    table.caption = (
        f"fits: {fits} | {r.flops / 1e12:.1f} TFLOP/step, recompute overhead "
        f"{_pct(r.meta.get('recompute_overhead'))} | compiled in {r.compile_seconds:.1f} s"
        + (" | XLA's own remat pass stepped in" if r.xla_remat else "")
    )
    est = r.meta.get("offload_estimate")
    if est:
        table.caption += (
            f"\noffload (estimates at the host link / bf16 peak): transfer "
            f"{est['transfer_seconds'] * 1e3:.0f} ms per step vs recomputing the same tensors "
            f"{est['recompute_seconds'] * 1e3:.0f} ms; step compute "
            f"{est['step_compute_seconds'] * 1e3:.0f} ms"
        )
    return table


def _residual_table(res: Any, r: Any) -> Any:
    from rich.table import Table

    layers = r.meta.get("layers") or 1
    table = Table(title="what the policy keeps, per tag (one micro-batch)")
    for col in ("tag", "decision", "MiB per layer", "MiB all layers"):
        table.add_column(col, justify="left" if col in ("tag", "decision") else "right")
    by_name = res.per_name()
    for tag, decision in res.tags.items():
        row = by_name.get(tag)
        kept = row["bytes"] if row else 0
        per_layer = kept / max(layers, 1) if row else res.tag_bytes.get(tag, 0)
        table.add_row(
            tag,
            decision,
            _fmt(per_layer if row else 0, 2**20),
            _fmt(kept, 2**20),
        )
    untagged = sum(v["bytes"] for k, v in by_name.items() if k not in res.tags)
    table.caption = (
        f"residuals kept on device {res.bytes_by('saved') / _GIB:.2f} GiB "
        f"(untagged values and weights included: {untagged / _GIB:.2f} GiB), "
        f"offloaded {res.bytes_by('offloaded') / _GIB:.2f} GiB"
    )
    return table


def _fmt(value: float | None, unit: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value / unit:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default))
    tmp.replace(path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(buf.getvalue())


if __name__ == "__main__":
    raise SystemExit(main())
