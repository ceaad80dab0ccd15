"""``remat-kit inspect``: what is live at the peak of a preset's train step, and when.

Prints the peak, its largest buffers and its bytes by category and layer; with ``--diff P1 P2``
also what P2 keeps at its peak that P1 does not. ``--json`` writes the report(s), ``--plot`` the
memory timeline, ``--trace`` a Chrome trace of the predicted kernels beside the live bytes (both
policies' with ``--diff``), ``--xprof`` a profile directory XProf's Memory Viewer opens. The
preset is looked up here (``models``): the inspector itself (:mod:`remat_kit.peak`) takes any
train step and never imports ``models``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from remat_kit import sources
from remat_kit.cli._model import ModelRun, resolve
from remat_kit.cli._values import policy_arg, schedule_arg
from remat_kit.errors import BadValue
from remat_kit.peak import PeakReport, check_target, diff, inspect_step
from remat_kit.policies import Policy, as_policy
from remat_kit.render import (
    buffer_table,
    check_profile_dir,
    check_trace,
    console,
    diff_table,
    fitted,
    module_names,
    opts_precision,
    peak_table,
    plot_timeline,
    run_words,
    split_table,
    write_inspection,
    write_json,
)
from remat_kit.schedules import Schedule, parse_schedule
from remat_kit.targets import Target
from remat_kit.timing import speed_of

__all__ = [
    "run",
]


def _checked(args: argparse.Namespace) -> tuple[ModelRun, list[str], Path | None, Path | None]:
    """Every value of ``inspect``, checked before anything is traced: the model run, the
    policies (one, or two with ``--diff``), the ``--trace`` file and the ``--xprof`` folder.

    Raises:
      BadValue: a value that cannot be used, named with what would be valid.
    """
    if getattr(args, "shard", None):
        raise BadValue("inspect reads one device's buffers: drop --shard (report/fit take it)")
    if getattr(args, "node", None):
        raise BadValue("inspect reads one device's buffers: drop --node (report/compare take it)")
    trace = getattr(args, "trace", None)
    if trace is not None:
        check_trace(trace, flag="--trace")
    xprof = getattr(args, "xprof", None)
    if xprof is not None:
        check_profile_dir(xprof, flag="--xprof")
    run = resolve(args)
    check_target(run.target)
    if trace is not None and speed_of(run.target) is None:
        raise BadValue(
            f"--trace needs a step-time model, which target {run.target.name!r} has none of: "
            "name a catalogue GPU (remat-kit targets)"
        )
    policies = list(args.diff) if getattr(args, "diff", None) else [args.policy]
    flag = "--diff" if getattr(args, "diff", None) else "--policy"
    for spec in policies:
        pol = policy_arg(spec, flag, own_names=run.own_names)
        schedule_arg(getattr(args, "schedule", "none"), "--schedule", run.n_layers, pol)
    # The one tag check: a name-based policy must match a tag.
    sources.check_policies(run.source, run.config, run.target, policies)
    if getattr(args, "top", 10) < 1:
        raise BadValue(f"--top {args.top} must be positive: the number of buffers shown")
    return run, policies, trace, xprof


def run(args: argparse.Namespace) -> int:
    """Inspects one policy (or two with ``--diff``): prints tables, writes --json/--plot.

    Args:
      args: parsed arguments of the ``inspect`` parser.

    Returns:
      The exit code (0).

    Raises:
      BadValue: an unknown model, policy or target, or ``--shard`` given (the CLI prints
        it on one line).
      InspectError: XLA's dump could not be produced or read.

    Example:
      ``remat-kit inspect --model tiny-llama --diff full none`` parses its flags and calls this.
    """
    # Every value, output paths included, is checked before the first trace or compile.
    run, policies, trace, xprof = _checked(args)
    tgt = run.target  # the one report compiles for (its allocator fraction included)
    schedule = parse_schedule(getattr(args, "schedule", "none"))
    reports = [
        _inspect(run, tgt, as_policy(p), schedule, trace is not None, xprof is not None)
        for p in policies
    ]
    out = console(args.wide)
    for r in reports:
        out.print(fitted(peak_table(r), out.width))
        out.print(fitted(buffer_table(r, getattr(args, "top", 10)), out.width))
        out.print(fitted(split_table(r), out.width))
    result: dict[str, Any] = {"reports": [r.to_dict() for r in reports]}
    if len(reports) == 2:
        d = diff(reports[0], reports[1])
        out.print(fitted(diff_table(d, policies), out.width))
        result["diff"] = d.to_dict()
    if getattr(args, "plot", None):
        plot_timeline(
            reports if len(reports) > 1 else reports[0],
            args.plot,
            labels=policies,
            title=f"{run_words(run)} on {tgt.label}",
            memory_bytes=tgt.memory_bytes,
            usable_bytes=tgt.usable_bytes,
            precision=opts_precision(run),
        )
        out.print(f"timeline written to {args.plot}")
    write_inspection(
        reports, tgt, policies, trace=trace, xprof=xprof, trace_flag="--trace", xprof_flag="--xprof"
    )
    if trace is not None:
        out.print(f"trace written to {trace} (open it in https://ui.perfetto.dev)")
    if xprof is not None:
        programs = [(r.module or "module", r.hlo_proto or b"") for r in reports]
        shown = ", ".join(
            f"{name} ({spec})"
            for name, spec in zip(module_names([m for m, _ in programs]), policies, strict=True)
        )
        out.print(
            f"profile written to {xprof}: `xprof --logdir {xprof}`, then Memory Viewer, "
            f"module {shown}"
        )
    if getattr(args, "json", None):
        write_json(args.json, result if len(reports) > 1 else result["reports"][0], flag="--json")
    return 0


def _inspect(
    run: ModelRun,
    tgt: Target,
    pol: Policy,
    schedule: Schedule,
    series: bool = False,
    hlo_proto: bool = False,
) -> PeakReport:
    # The unsharded step, as report runs it (dropout), its trace checked as report's is.
    built = run.source.build_step(pol, schedule, run.config, tgt, sharded=False)
    run.source.check_step(built, run.source.spec)
    meta = {
        "model": run.model,
        "policy": pol.spec,
        "batch": run.batch,
        "seq": run.seq,
        "attention": built.attention,
        "optimizer": run.optimizer,
        "lora": run.lora,
        "accum": run.accum,
        "precision": run.precision_record(),
        "usable_bytes": tgt.usable_bytes,  # the title's fits (remat_kit.render.peak_table)
    }
    return inspect_step(built.step, tgt, meta=meta, series=series, hlo_proto=hlo_proto)
