"""``remat-kit report``: the peak HBM of one policy, with its breakdown and saved residuals."""

from __future__ import annotations

import argparse
import warnings

from remat_kit import sources
from remat_kit.cli._model import resolve, run_notes
from remat_kit.cli._values import policy_arg, schedule_arg
from remat_kit.notes import words
from remat_kit.policies import NO_REMAT
from remat_kit.render import (
    SCHEDULER_WORDS,
    console,
    fitted,
    report_table,
    residual_table,
    write_json,
    xla_limits_words,
)

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Compiles one policy for the target; prints the report (and residuals), writes --json.

    Args:
      args: parsed arguments of the ``report`` parser.

    Returns:
      The exit code (0).

    Raises:
      BadValue: an unknown model, policy, schedule, target or optimizer, or a bad size.

    Example:
      ``remat-kit report --model tiny-llama --policy minimal`` parses its flags and calls this.
    """
    # Every value, output path included, is checked before the first trace or compile.
    run = resolve(args)
    src, target, config = run.source, run.target, run.config
    policy = policy_arg(args.policy, "--policy", own_names=run.own_names)
    schedule = schedule_arg(args.schedule, "--schedule", run.n_layers, policy)
    sources.check_policies(src, config, target, [policy])  # the one tag check
    baseline = sources.step_flops(src, NO_REMAT, target, config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report's own warnings are printed below
        report = sources.measure(
            src,
            policy,
            target,
            config,
            schedule=schedule,
            baseline=baseline,
            measured_breakdown=args.measured_breakdown,
            depth=args.depth,
        )
    res = None
    # A user's step given without its loss has no backward pass of a loss to read.
    loss_given = report.meta.loss_given is not False  # only an own step says it
    if not args.no_residuals and loss_given:
        res = sources.residuals(src, policy, target, config, schedule)
    out = console(args.wide)
    out.print(fitted(report_table(report, target), out.width))
    if res is not None:
        out.print(fitted(residual_table(res, report, target.device_word), out.width))
    said = [words(note) for note in report.notes]
    # Which limit decides fits, where XLA's lines name limits of their own (issue 45).
    limits = xla_limits_words(
        target,
        [report.xla_remat_limit_bytes] if report.xla_remat_limit_bytes else [],
        any(SCHEDULER_WORDS in line for line in said),
    )
    if limits and any(n.kind == "xla_log" for n in report.notes):
        out.print(limits)
    for line in said:
        out.print(f"[yellow]warning:[/yellow] {line}")
    if not args.no_residuals and not loss_given:
        out.print(
            "note: no residual table: the step was given without its loss (return "
            "rk.sources.OwnStep(..., loss_fn=, loss_args=) for one)"
        )
    for line in run_notes(run):
        out.print(f"[yellow]note:[/yellow] {line}")
    if args.json:
        data = report.to_dict()
        if res is not None:
            data["residuals"] = res.to_dict()
        write_json(args.json, data, flag="--json")
    return 0
