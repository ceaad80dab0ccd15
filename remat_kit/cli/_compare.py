"""``remat-kit compare``: a table of policies (and schedules) for one model and target."""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from concurrent.futures import Executor

from remat_kit import _workers, sources
from remat_kit.analysis import MemoryReport
from remat_kit.cli._model import ModelRun, Request, resolve, run_notes
from remat_kit.cli._next import next_step_lines
from remat_kit.cli._placement import check_cluster, cluster_executor
from remat_kit.cli._values import flag_items, policy_arg, schedule_arg
from remat_kit.comparison import compare_rows
from remat_kit.errors import BadValue
from remat_kit.notes import Note, label, shared_words, words
from remat_kit.policies import NO_REMAT, Policy
from remat_kit.render import (
    SCHEDULER_WORDS,
    compare_table,
    console,
    fitted,
    length_words,
    progress,
    write_csv,
    write_json,
    xla_limits_words,
)
from remat_kit.schedules import Schedule
from remat_kit.search import FRONT_POLICIES
from remat_kit.targets import Target

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Compiles every (policy, schedule) for the target; prints the table, writes --json/--csv.

    Args:
      args: parsed arguments of the ``compare`` parser.

    Returns:
      The exit code (0).

    Raises:
      BadValue: empty ``--policies`` or ``--schedules``, or an unknown name in them (before
        any compile), or a bad model, target or size.

    Example:
      ``remat-kit compare --model tiny-llama --policies none,full`` parses its flags and calls this.
    """
    # Every value, output paths included, is checked before the first trace or compile.
    check_cluster(args)
    run = resolve(args)
    target = run.target
    specs = flag_items(args.policies, "--policies", example="none,full,minimal")
    policies = [policy_arg(s, "--policies", own_names=run.own_names) for s in specs]
    # One whose tags the model lacks is skipped and named under the table; where the user
    # named them all, or one half-matches (a typo), it is an error (before any compile).
    policies, skipped = sources.usable_policies(
        run.source,
        run.config,
        target,
        policies,
        given=args.policies != ",".join(FRONT_POLICIES),
    )
    # One the model's steps cannot take is left out of the default list, with the source's
    # reason under the table; one the user named is refused as it is built.
    refused: list[Note] = []
    if args.policies == ",".join(FRONT_POLICIES):
        policies, refused = sources.buildable_policies(run.source, run.config, target, policies)
    sched_specs = args.schedules.replace(";", " ").split()
    schedules = [schedule_arg(s, "--schedules", run.n_layers) for s in sched_specs]
    if not schedules:
        raise BadValue("--schedules is empty; give e.g. 'none;every:2;sqrt'")
    cases = [(p, s) for s in schedules for p in policies]
    if args.cluster is not None and target.kind == "local":
        raise BadValue(
            f"--cluster {args.cluster}: the workers compile for jax's CPU platform, not for "
            "this machine's own GPU (--target local): name the GPU with --target instead"
        )
    with cluster_executor(args) as executor:  # connected before any compile
        return _compare_cases(args, run, cases, (skipped, refused), executor)


def _compare_cases(
    args: argparse.Namespace,
    run: ModelRun,
    cases: list[tuple[Policy, Schedule]],
    left_out: tuple[list[str], list[Note]],
    executor: Executor | None,
) -> int:
    """Compiles the cases (here, in ``--jobs`` processes or on the ``--cluster``), prints."""
    target = run.target
    start = time.perf_counter()
    # The recompute overhead is against the FLOPs of "none". A "none" row counts them from
    # its own trace, so a separate trace of them (two shallow copies of an unrolled model:
    # a tenth of compare's time) is made only without one. Not for a sharded step, whose
    # rows trace the program the mesh runs.
    plain = [i for i, (p, s) in enumerate(cases) if p.spec == "none" and s.name == "none"]
    if run.source.mesh_plan(target) is not None:
        plain = []
    baseline = None if plain else sources.step_flops(run.source, NO_REMAT, target, run.config)
    # The programs are independent: with --jobs N they compile side by side in N processes
    # (not for a local target: workers compile for jax's CPU platform).
    jobs = 1 if target.kind == "local" else args.jobs
    done: list[int] = []
    what = f"compare on {target.label}" + (
        f" on the cluster at {args.cluster}"
        if executor is not None
        else f" in {min(jobs, len(cases))} processes"
        if jobs > 1
        else ""
    )
    length = length_words(what, len(cases), how="one per policy and schedule")
    with progress(what, total=len(cases), done=lambda: len(done), length=length) as step:
        step(f"{label(cases[0][0].spec, cases[0][1].spec)}")

        def on_done(i: int, r: MemoryReport) -> None:
            done.append(i)
            if len(done) < len(cases):
                step(f"{label(r.policy, r.schedule)} done")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # printed once, after the table
            reports = _workers.run(
                functools.partial(_measure_case, run.request, target, baseline),
                [(p.spec, sch.spec) for p, sch in cases],
                jobs,
                on_done=on_done,
                executor=executor,
            )
    if baseline is None:
        baseline = reports[plain[0]].flops
        if baseline:  # as measure() takes it: no FLOPs, no overhead
            reports = [sources.with_baseline(r, baseline) for r in reports]
    return _print_rows(args, run, reports, left_out, time.perf_counter() - start)


def _print_rows(
    args: argparse.Namespace,
    run: ModelRun,
    reports: list[MemoryReport],
    left_out: tuple[list[str], list[Note]],
    seconds: float,
) -> int:
    """Prints the table, the policies left out (no tag of theirs; the source's notes) and the
    notes the rows share (once, naming the rows), writes ``--json`` and ``--csv``; the exit
    code (0)."""
    target = run.target
    skipped, refused = left_out
    rows = compare_rows(reports)
    out = console(args.wide)
    out.print(fitted(compare_table(rows, target, run, seconds), out.width))
    if skipped:
        there = ", ".join(sources.tags(run.source, run.config, target)) or "none"
        out.print(
            f"not compared (the model tags none of their tensors): {', '.join(skipped)}; "
            f"the model's tags: {there}"
        )
    for note in refused:
        out.print(f"not compared: {words(note)}", highlight=False)
    for line in run_notes(run):
        out.print(f"[yellow]note:[/yellow] {line}")
    # Not fitting and XLA's own remat are in the table's fits column already; a note that
    # several rows share (an XLA log line about the inputs) is printed once, naming them.
    shared: dict[str, list[str]] = {}
    for r in reports:
        for note in r.notes:
            if note.kind not in ("does_not_fit", "xla_remat"):
                shared.setdefault(shared_words(note), []).append(label(r.policy, r.schedule))
    limits = xla_limits_words(
        target,
        [r.xla_remat_limit_bytes for r in reports if r.xla_remat_limit_bytes],
        any(SCHEDULER_WORDS in line for line in shared),
    )
    if limits and shared:
        out.print(limits)
    for note, labels in shared.items():
        who = f"all {len(labels)} rows" if len(labels) == len(reports) > 1 else ", ".join(labels)
        out.print(f"[yellow]{who}:[/yellow] {note}")
    if reports and not any(r.fits for r in reports if r.fits is not None) and target.usable_bytes:
        lines = next_step_lines(args, run, reports)
        out.print(f"[bold]nothing fits:[/bold] {lines[0]}")
        for line in lines[1:]:
            out.print(line)
    if args.json:
        write_json(args.json, rows, flag="--json")
    if args.csv:
        write_csv(args.csv, rows, flag="--csv")
    return 0


def _measure_case(
    request: Request, target: Target, baseline: float | None, case: tuple[str, str]
) -> MemoryReport:
    """One row of the comparison: the report of ``(policy spec, schedule spec)``; a module-level
    function of the picklable request, so a worker process can run it."""
    from remat_kit.policies import parse_policy
    from remat_kit.schedules import parse_schedule

    policy, schedule = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sources.measure(
            request.source(),
            parse_policy(policy),
            target,
            request.config,
            schedule=parse_schedule(schedule),
            baseline=baseline,
            depth=request.depth,
        )
