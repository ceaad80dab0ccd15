"""``remat-kit compare``: a table of policies (and schedules) for one model and target."""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path
from typing import Any

from remat_kit.cli._args import add_model_args, comma_list, target_from_args
from remat_kit.policies import parse_policy
from remat_kit.render import console, write_csv, write_json
from remat_kit.render.tables import compare_rows, compare_table
from remat_kit.schedules import label, parse_schedule
from remat_kit.search import FRONT_POLICIES

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds ``compare`` to the ``remat-kit`` subparsers.

    Args:
      subparsers: what ``ArgumentParser.add_subparsers`` returned.

    Returns:
      The ``compare`` parser.

    Example:
      >>> add_parser(parser.add_subparsers(dest="command"))  # doctest: +SKIP
    """
    p = subparsers.add_parser("compare", help="a table of policies for one model and target")
    add_model_args(p)
    p.add_argument(
        "--policies", default=",".join(FRONT_POLICIES), help="comma-separated names or specs"
    )
    p.add_argument(
        "--schedules",
        "--schedule",
        default="none",
        help="comma-free list separated by ';' or spaces, e.g. 'none;every:2;sqrt'",
    )
    p.add_argument("--csv", type=Path, default=None, help="write the rows as CSV")
    return p


def run(args: argparse.Namespace) -> int:
    """Compiles every (policy, schedule) for the target; prints the table, writes --json/--csv.

    Args:
      args: parsed arguments of the ``compare`` parser.

    Returns:
      The exit code (0).

    Raises:
      ValueError: empty ``--policies`` or ``--schedules``, or an unknown name in them (before
        any compile), or a bad model, target or size.

    Example:
      >>> run(parser.parse_args(["compare", "--model", "tiny-llama"]))  # doctest: +SKIP
      0
    """
    from rich.progress import Progress

    from models.measure import baseline_flops, measure, options_from_args

    opts = options_from_args(args)
    target = target_from_args(args)
    specs = comma_list(args.policies)
    if not specs:
        raise ValueError("--policies is empty; give names such as none,full,minimal")
    policies = [parse_policy(s) for s in specs]  # fail on a bad name before compiling
    schedules = [parse_schedule(s) for s in args.schedules.replace(";", " ").split()]
    if not schedules:
        raise ValueError("--schedules is empty; give e.g. 'none;every:2;sqrt'")
    cases = [(p, s) for s in schedules for p in policies]
    start = time.perf_counter()
    baseline = baseline_flops(opts, target)
    reports = []
    with Progress(transient=True) as progress:
        task = progress.add_task(f"compiling for {target.name}", total=len(cases))
        for p, sch in cases:
            progress.update(
                task, description=f"compiling {label(p.spec, sch.spec)} for {target.name}"
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # printed once, after the table
                reports.append(measure(opts, p, target, schedule=sch, baseline=baseline))
            progress.advance(task)
    seconds = time.perf_counter() - start
    rows = compare_rows(reports)
    out = console()
    out.print(compare_table(rows, target, opts, seconds))
    for r in reports:
        # Not fitting and XLA's own remat are in the table's fits column already.
        for note in r.warnings:
            if not note.startswith(("does not fit", "XLA's own")):
                out.print(f"[yellow]{r.policy}:[/yellow] {note}")
    if args.json:
        write_json(args.json, rows, flag="--json")
    if args.csv:
        write_csv(args.csv, rows, flag="--csv")
    return 0
