"""``remat-kit fit``: the largest batch that fits, per policy (or the planner's best plan);
with ``--over seq``, the longest sequence at a fixed batch."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
import warnings
from collections.abc import Collection, Mapping
from concurrent.futures import Executor

from remat_kit import sources
from remat_kit.cli._model import (
    ModelRun,
    Request,
    print_caveats,
    print_notes,
    rebuilt,
    resolve,
    with_spread,
)
from remat_kit.cli._placement import check_cluster, cluster_executor
from remat_kit.cli._values import flag_items, policy_arg, schedule_arg
from remat_kit.errors import BadValue
from remat_kit.notes import label
from remat_kit.policies import Policy
from remat_kit.render import (
    FitRow,
    compiling_words,
    console,
    fastest_words,
    fit_table,
    fitted,
    length_words,
    limit_words,
    longest_words,
    nothing_fits_words,
    progress,
    seq_table,
    throughput_table,
    write_json,
)
from remat_kit.schedules import Schedule
from remat_kit.search import (
    DEFAULT_GRANULARITY,
    DEFAULT_SEQ_CAP,
    PLAN,
    Fit,
    check_budget,
    fastest,
    fit,
    fit_each,
    limit_for,
    seq_multiple,
)
from remat_kit.sources import Workload
from remat_kit.targets import Target

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Searches the largest batch per policy; prints the table and messages, writes --json.

    Args:
      args: parsed arguments of the ``fit`` parser.

    Returns:
      The exit code: 0, or 1 when no policy fits even the smallest batch (sequence).

    Raises:
      BadValue: empty ``--policies`` or an unknown name in them (before any compile), a flag
        the chosen search does not take, or a bad model, target, schedule or size.

    Example:
      ``remat-kit fit --model tiny-llama --target h100`` parses its flags and calls this.
    """
    given = getattr(args, "given", ())
    check_cluster(args)
    if args.over == "seq":
        return _over_seq(args, given)
    _batch_flags(args, given)
    # The search sets the batch; the one the step is first built with only has to split into
    # --accum micro-batches over the data-parallel GPUs (their count divides --gpus), which
    # --batch's default of 4 need not (--accum 3).
    args.batch = args.accum * args.gpus
    args.batch_searched = True  # resolve: the first batch the source's steps take
    # Every value, the output path included, is checked before the first trace or compile.
    run = resolve(args)
    target = run.target
    policies, schedule = _policies(args, run)
    w = sources.workload(run.source, target, run.config, depth=run.depth)
    # Weights, gradients and optimizer state over the limit: no batch of any policy fits, and
    # the one line says what would (LoRA, SGD, a larger GPU, sharding), before any search.
    check_budget(w, w.batch_multiple, limit_for(target, None, args.headroom))
    print_notes(run, args.wide)
    with cluster_executor(args) as executor:  # connected before any compile
        w = with_spread(w, args, run, executor)
        if args.objective == "throughput":
            return _throughput(args, run, w, policies, schedule, executor)
        start = time.perf_counter()
        rows, compiles = _largest_batches(args, w, policies, schedule)
        return _print_batches(args, run, w, rows, time.perf_counter() - start, compiles)


def _accumulating(request: Request, target: Target, ways: int | None, accum: int) -> Workload:
    """The step of ``request`` on ``target`` accumulating over ``accum`` micro-batches of one
    sequence per data-parallel GPU (``ways`` None: as the request builds it), as
    ``--objective throughput`` builds it here (module-level, for a worker process)."""
    if ways is not None:
        config = dataclasses.replace(request.config, accum=accum, batch=accum * ways)
        request = dataclasses.replace(request, config=config)
    return rebuilt(request, target)


def _batch_flags(args: argparse.Namespace, given: Collection[str]) -> None:
    """The batch search's flags, checked before anything is resolved.

    Raises:
      BadValue: a flag of the sequence search, ``--batch`` (the search sets it), or a
        throughput flag without ``--objective throughput`` (or the reverse).
    """
    if args.seq_step is not None:
        raise BadValue(
            f"--seq-step {args.seq_step} needs --over seq (it is the granularity of the "
            "sequence search)"
        )
    if "--batch" in given:
        raise BadValue(
            f"--batch {args.batch}: fit searches the batch (from where the trace puts the "
            "largest); drop --batch, or measure one batch with report (--over seq searches "
            "the sequence at a given batch)"
        )
    throughput = args.objective == "throughput"
    if args.global_batch is not None and not throughput:
        raise BadValue(
            f"--global-batch {args.global_batch} needs --objective throughput (the largest "
            "batch search has no global batch)"
        )
    if throughput and args.accum > 1 and "--accum" in given:
        raise BadValue(
            f"--accum {args.accum}: --objective throughput picks the accumulation; give "
            "--global-batch N for the sequences per optimizer step"
        )
    if args.global_batch is not None and args.global_batch < 1:
        raise BadValue(f"--global-batch {args.global_batch}: must be at least 1")


def _largest_batches(
    args: argparse.Namespace,
    w: Workload,
    policies: Mapping[str, Policy | None],
    schedule: Schedule,
) -> tuple[list[FitRow], int]:
    """The largest batch of each policy (None: the planner's), one row each, and the
    programs compiled for them (on a cluster's workers too: ``fit_each``)."""
    length = length_words(
        f"fit over {len(policies)} polic{'y' if len(policies) == 1 else 'ies'}",
        how="each policy's largest batch is found by compiling on both sides of it",
    )
    specs = list(policies)
    remote: list[int] = []  # the compiles of the searches a cluster's workers ran

    def done() -> int:
        return w.compiles + sum(remote)

    trying = functools.partial(compiling_words, [w], policy=None in policies.values())
    with (
        warnings.catch_warnings(),
        progress("fit", done=done, length=length, now=trying) as step,
    ):
        warnings.simplefilter("ignore")  # the tables show what matters
        began: set[int] = set()  # searched one by one here, each named as it starts
        finished: list[int] = []

        def started(i: int) -> None:
            began.add(i)
            step(f"{specs[i]} ({i + 1}/{len(specs)})")

        def ended(i: int, found: Fit, here: bool) -> None:
            finished.append(i)
            if not here:
                remote.append(found.compiles)
            if i not in began:  # spread over a cluster: named as each is done
                step(f"{specs[i]} done ({len(finished)}/{len(specs)})")

        fits = fit_each(
            w,
            [PLAN if pol is None else pol for pol in policies.values()],
            schedule,
            headroom=args.headroom,
            offload=not args.no_offload,
            hide=args.hide,
            started=started,
            ended=ended,
        )
    rows = [
        FitRow(
            (f"plan: {label(fit.policy, fit.schedule)}" if fit.fits else "plan")
            if policies[spec] is None
            else label(fit.policy, fit.schedule),
            fit,
        )
        for spec, fit in zip(specs, fits, strict=True)
    ]
    return rows, done()


def _print_batches(
    args: argparse.Namespace,
    run: ModelRun,
    w: Workload,
    rows: list[FitRow],
    seconds: float,
    compiles: int,
) -> int:
    """Prints the table and the messages, writes ``--json``; the exit code: 1 when nothing
    fits even the smallest batch, else 0."""
    target = run.target
    out = console(args.wide)
    table = fit_table(rows, target, run, headroom=args.headroom, compiles=compiles, seconds=seconds)
    out.print(fitted(table, out.width))
    fits = any(row.fit.fits for row in rows)
    for row in rows:
        # When nothing fits, the table's batch-1 peaks and the one line below say it once.
        if fits and (not row.fit.fits or row.label.startswith("plan")):
            out.print(row.fit.message)
    # Where XLA's own remat pass, not the policy, made a row fit: its batch is not the
    # policy's to claim, and its step recomputes what the recompute column does not count.
    print_caveats((n for row in rows for n in row.fit.caveats), args.wide)
    if args.json:
        data = [row.to_dict() for row in rows]
        write_json(
            args.json, {"seconds": seconds, "compiles": compiles, "rows": data}, flag="--json"
        )
    if not fits:
        advice = "remat-kit plan --batch 1 for a per-tag plan, or remat-kit advise for a GPU"
        return _nothing_fits(rows, f"batch {w.batch_multiple}", target, advice)
    return 0


def _nothing_fits(rows: list[FitRow], smallest: str, target: Target, advice: str) -> int:
    """Says on stderr that no policy fits even the smallest point (``smallest``: ``batch 1``)
    searched, with the smallest peak and what to try; exit code 1: the search ran and found
    nothing that fits (docs/commands/index.md, "Exit codes")."""
    least = min(rows, key=lambda row: row.fit.peak_bytes)
    fit = least.fit
    line = nothing_fits_words(
        smallest, fit.peak_bytes, least.label, fit.limit_bytes, target, advice
    )
    sys.stderr.write(f"remat-kit: {line}\n")
    return 1


def _throughput(
    args: argparse.Namespace,
    run: ModelRun,
    w: Workload,
    policies: dict[str, Policy | None],
    schedule: Schedule,
    executor: Executor | None,
) -> int:
    """``--objective throughput``: the fastest micro-batch per policy, the winner marked."""
    ways = w.batch_multiple
    if args.global_batch is not None and args.global_batch % ways:
        raise BadValue(
            f"--global-batch {args.global_batch} does not split over the {ways} data-parallel "
            f"GPUs; use a multiple of {ways}"
        )

    made: list[Workload] = []

    def accumulate(accum: int) -> Workload:
        # The step is first built at one micro-batch per data-parallel GPU per pass (the
        # search sets the batch); it has to split into ``accum`` passes.
        config = dataclasses.replace(run.config, accum=accum, batch=accum * ways)
        made.append(sources.workload(run.source, run.target, config, depth=run.depth))
        return made[-1]

    specs = [PLAN if pol is None else pol for pol in policies.values()]
    what = "fit --objective throughput"
    length = length_words(
        f"{what} over {len(specs)} polic{'y' if len(specs) == 1 else 'ies'}",
        how="each policy's largest batch is found by compiling on both sides of it, then its "
        "candidate micro-batches are compiled and timed",
    )

    def done() -> int:
        return w.compiles + sum(a.compiles for a in made)

    def trying() -> str | None:
        return compiling_words([w, *made], policy=True)

    with (
        warnings.catch_warnings(),
        progress(what, done=done, length=length, now=trying) as step,
    ):
        warnings.simplefilter("ignore")  # the table shows what matters
        found = fastest(
            w,
            specs,
            schedule,
            global_batch=args.global_batch,
            # On a cluster the step is rebuilt in each worker: builders that pickle.
            accumulate=accumulate
            if executor is None
            else functools.partial(_accumulating, run.request, run.target, ways),
            headroom=args.headroom,
            offload=not args.no_offload,
            hide=args.hide,
            progress=step,
            executor=executor,
            workload_for=None
            if executor is None
            else functools.partial(rebuilt, run.request, run.target),
        )
    out = console(args.wide)
    limit = limit_words(run.target, args.headroom)
    out.print(fitted(throughput_table(found, run, limit_words=limit), out.width))
    out.print(fastest_words(found))
    if args.json:
        write_json(args.json, found.to_dict(), flag="--json")
    if not any(row.fits for row in found.rows):
        sys.stderr.write(f"remat-kit: nothing fits on {run.target.label}\n")
        return 1
    return 0


def _seq_flags(args: argparse.Namespace, given: Collection[str]) -> tuple[int, int]:
    """``--over seq``'s flags, checked before anything is resolved: the granularity and the
    cap (``--seq-step``, ``--max-seq``).

    Raises:
      BadValue: a flag the sequence search does not take, or a cap below the granularity.
    """
    step = DEFAULT_GRANULARITY if args.seq_step is None else args.seq_step
    if args.objective == "throughput":
        raise BadValue(
            "--objective throughput with --over seq: the throughput search picks the batch at "
            "one --seq; drop one of them"
        )
    if args.global_batch is not None:
        raise BadValue(
            f"--global-batch {args.global_batch} with --over seq: the sequence search keeps "
            "--batch fixed; give --batch N"
        )
    if args.cluster is not None:
        raise BadValue(
            f"--cluster {args.cluster} with --over seq: the sequence search compiles one probe "
            "after another, each placed by the last; drop --cluster"
        )
    if "--seq" in given:
        raise BadValue(
            f"--seq {args.seq}: fit --over seq searches the sequence; drop --seq (--seq-step "
            "sets the granularity, --max-seq the longest)"
        )
    cap = DEFAULT_SEQ_CAP if args.max_seq is None else args.max_seq
    if cap < step:
        raise BadValue(
            f"--seq-step {step} is longer than --max-seq {cap}: nothing to search; give a "
            f"--seq-step of at most {cap}"
        )
    return step, cap


def _over_seq(args: argparse.Namespace, given: Collection[str]) -> int:
    """``--over seq``: the longest sequence per policy at a fixed batch, the longest starred.

    Every flag is checked before the first compile. The sequences are multiples of
    ``--seq-step``, which must split over the mesh's sequence axis; ``--max-seq`` (the
    model's longest sequence) is the cap, and a model with learned positions refuses longer
    sequences, which the search reads as an upper bound.
    """
    step, cap = _seq_flags(args, given)
    batch_given = "--batch" in given
    if not batch_given:
        # A batch every --accum and data-parallel split takes; the search's own default is
        # the smallest (the step's batch multiple), set below.
        args.batch = args.accum * args.gpus
        args.batch_searched = True  # resolve: the first batch the source's steps take
    args.seq = step  # the model's checks run at the shortest sequence searched
    try:
        run = resolve(args)
    except BadValue as err:
        if err.param != "seq":
            raise
        raise BadValue(f"--seq-step {step}: {err}") from None
    target = run.target
    multiple = seq_multiple(run.source.mesh_plan(target))
    if step % multiple:
        raise BadValue(
            f"--seq-step {step}: --shard {args.shard} splits the sequence {multiple} ways; "
            f"use a multiple of {multiple}"
        )
    policies, schedule = _policies(args, run)
    print_notes(run, args.wide)
    # The step at the shortest sequence; the search builds the others with first.at(seq=),
    # where the model's own checks (learned positions, sizes) refuse a sequence it cannot
    # take, which the search reads as an upper bound. Every one is a multiple of --seq-step.
    first = sources.workload(run.source, target, run.config, depth=run.depth)
    batch = args.batch if batch_given else first.batch_multiple
    if batch % first.batch_multiple:
        raise BadValue(
            f"--batch {batch} does not split into --accum {args.accum} x "
            f"{first.batch_multiple // args.accum} data-parallel GPUs; use a multiple of "
            f"{first.batch_multiple}"
        )
    # Weights, gradients and optimizer state over the limit: no sequence fits (one line).
    check_budget(first, batch, limit_for(target, None, args.headroom))
    search = dict(axis="seq", granularity=step, headroom=args.headroom, cap=cap)
    w = first.at(batch=batch)
    start = time.perf_counter()
    rows = []
    length = length_words(
        f"fit --over seq over {len(policies)} polic{'y' if len(policies) == 1 else 'ies'}",
        how="each policy's longest sequence is found by compiling on both sides of it",
    )

    def trying() -> str | None:
        return compiling_words(list(first.family), axis="seq")

    with (
        warnings.catch_warnings(),
        progress("fit --over seq", length=length, now=trying) as tick,
    ):
        warnings.simplefilter("ignore")  # the table shows what matters
        for i, (spec, pol) in enumerate(policies.items()):
            tick(f"{spec} ({i + 1}/{len(policies)})")
            if pol is None:
                found = fit(w, PLAN, offload=not args.no_offload, hide=args.hide, **search)
                name = f"plan: {label(found.policy, found.schedule)}" if found.fits else "plan"
            else:
                found = fit(w, pol, schedule, **search)
                name = label(found.policy, found.schedule)
            rows.append(FitRow(name, found))
    seconds = time.perf_counter() - start
    compiles = sum(x.compiles for x in first.family)
    return _print_seq(args, run, rows, batch, step, cap, seconds, compiles)


def _print_seq(
    args: argparse.Namespace,
    run: ModelRun,
    rows: list[FitRow],
    batch: int,
    step: int,
    cap: int,
    seconds: float,
    compiles: int,
) -> int:
    """``--over seq``'s table, notes and JSON; the exit code (1: nothing fits)."""
    target = run.target
    out = console(args.wide)
    limit = limit_words(target, args.headroom)
    table = seq_table(rows, target, run, limit_words=limit, compiles=compiles, seconds=seconds)
    out.print(fitted(table, out.width))
    fits = any(row.fit.fits for row in rows)
    if fits:
        out.print(longest_words(rows))
    for row in rows:
        # Why a row stopped where it did, where the table does not show it: nothing fits,
        # the cap, a sequence the model or XLA refused; and what the planner chose.
        stopped = row.fit.fits and row.fit.next_peak_bytes is None
        if fits and (not row.fit.fits or stopped or row.label.startswith("plan")):
            out.print(row.fit.message)
    print_caveats((n for row in rows for n in row.fit.caveats), args.wide)
    if args.json:
        data = {
            "over": "seq",
            "batch": batch,
            "granularity": step,
            "cap": cap,
            "seconds": seconds,
            "compiles": compiles,
            "rows": [row.to_dict() for row in rows],
        }
        write_json(args.json, data, flag="--json")
    if not fits:
        advice = "try a shorter --seq-step, a smaller --batch, or remat-kit advise for a GPU"
        return _nothing_fits(rows, f"seq {step} (batch {batch})", target, advice)
    return 0


def _policies(args: argparse.Namespace, run: ModelRun) -> tuple[dict[str, Policy | None], Schedule]:
    """The policies to search, by spec (None: the planner), and the schedule; the tag check
    of the named policies, once, before any compile."""
    if args.policy:
        flag, specs = "--policy", [args.policy]
    else:
        flag = "--policies"
        specs = flag_items(args.policies, flag, example="none,full,minimal,plan")
    # Keyed by spec, so a policy named twice is searched once; None stands for the planner.
    policies = {
        s: None if s == "plan" else policy_arg(s, flag, own_names=run.own_names) for s in specs
    }
    schedule = schedule_arg(args.schedule, "--schedule", run.n_layers)
    named = [p for p in policies.values() if p is not None]
    sources.check_policies(run.source, run.config, run.target, named)  # the one tag check
    return policies, schedule
