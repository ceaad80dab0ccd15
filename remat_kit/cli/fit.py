"""``remat-kit fit``: the largest batch that fits, per policy (or the planner's best plan)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from typing import Any

from remat_kit import sources
from remat_kit.cli import summary
from remat_kit.cli._args import add_model_args, add_search_args
from remat_kit.cli._model import resolve
from remat_kit.cli._values import flag_items, policy_arg, schedule_arg
from remat_kit.errors import BadValue
from remat_kit.render import console, write_json
from remat_kit.render.layout import fitted
from remat_kit.render.progress import progress
from remat_kit.render.tables import FitRow, fit_table, limit_words
from remat_kit.render.throughput import fastest_words, throughput_table
from remat_kit.schedules import label
from remat_kit.search import PLAN, check_budget, fastest, max_batch, max_batch_plan
from remat_kit.search.budget import limit_for

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Adds ``fit`` to the ``remat-kit`` subparsers.

    Args:
      subparsers: what ``ArgumentParser.add_subparsers`` returned.

    Returns:
      The ``fit`` parser.

    Example:
      >>> p = add_parser(argparse.ArgumentParser().add_subparsers())
      >>> p.parse_args(["--model", "tiny-llama"]).policies
      'none,full,minimal,plan'
    """
    p = subparsers.add_parser("fit", help=summary("fit"))
    add_model_args(
        p,
        batch_help="refused: the search finds the batch (report measures one)",
    )
    p.add_argument("--policy", default=None, help="one policy (name or spec)")
    p.add_argument(
        "--policies",
        default="none,full,minimal,plan",
        help="comma-separated policies; 'plan' is the planner at the largest batch",
    )
    p.add_argument("--schedule", default="none", help="layer schedule for every policy")
    p.add_argument(
        "--objective",
        choices=("batch", "throughput"),
        default="batch",
        help="batch: the largest batch per policy; throughput: the micro-batch that trains "
        "fastest per policy (predicted tokens/s), the winner against none at its largest batch",
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=None,
        metavar="N",
        help="with --objective throughput: sequences per optimizer step; the search picks the "
        "micro-batch x accumulation that reaches it fastest",
    )
    add_search_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    """Searches the largest batch per policy; prints the table and messages, writes --json.

    Args:
      args: parsed arguments of the ``fit`` parser.

    Returns:
      The exit code: 0, or 1 when no policy fits even the smallest batch.

    Raises:
      BadValue: empty ``--policies`` or an unknown name in them (before any compile), or a
        bad model, target, schedule or size.

    Example:
      ``remat-kit fit --model tiny-llama --target h100`` parses its flags and calls this.
    """
    if "--batch" in getattr(args, "given", ()):
        raise BadValue(
            f"--batch {args.batch}: fit searches the batch (from where the trace puts the "
            "largest); drop --batch, or measure one batch with report"
        )
    throughput = args.objective == "throughput"
    given = getattr(args, "given", ())
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
    # The search sets the batch; the one the step is first built with only has to split into
    # --accum micro-batches over the data-parallel GPUs (their count divides --gpus), which
    # --batch's default of 4 need not (--accum 3).
    args.batch = args.accum * args.gpus
    # Every value, the output path included, is checked before the first trace or compile.
    run = resolve(args)
    opts, target = run.opts, run.target
    if args.policy:
        flag, specs = "--policy", [args.policy]
    else:
        flag = "--policies"
        specs = flag_items(args.policies, flag, example="none,full,minimal,plan")
    # Keyed by spec, so a policy named twice is searched once; None stands for the planner.
    policies = {s: None if s == "plan" else policy_arg(s, flag) for s in specs}
    schedule = schedule_arg(args.schedule, "--schedule", run.n_layers)
    named = [p for p in policies.values() if p is not None]
    sources.check_policies(run.source, run.config, target, named)  # the one tag check
    w = sources.workload(run.source, target, run.config)
    # Weights, gradients and optimizer state over the limit: no batch of any policy fits, and
    # the one line says what would (LoRA, SGD, a larger GPU, sharding), before any search.
    check_budget(w, w.batch_multiple, limit_for(target, None, args.headroom))
    if throughput:
        return _throughput(args, run, w, policies, schedule)
    start = time.perf_counter()
    rows = []
    with warnings.catch_warnings(), progress("fit") as step:
        warnings.simplefilter("ignore")  # the tables show what matters
        for i, (spec, pol) in enumerate(policies.items()):
            step(f"{spec} ({i + 1}/{len(policies)})")
            if pol is None:
                fit, _ = max_batch_plan(
                    w, headroom=args.headroom, offload=not args.no_offload, hide=args.hide
                )
                name = f"plan: {label(fit.policy, fit.schedule)}" if fit.fits else "plan"
            else:
                # No start: the search begins where the trace puts the boundary.
                fit = max_batch(w, pol, schedule, headroom=args.headroom)
                name = label(fit.policy, fit.schedule)
            rows.append(FitRow(name, fit))
    seconds = time.perf_counter() - start
    out = console(args.wide)
    out.print(
        fitted(
            fit_table(
                rows, target, opts, headroom=args.headroom, compiles=w.compiles, seconds=seconds
            ),
            out.width,
        )
    )
    fits = any(row.fit.fits for row in rows)
    for row in rows:
        # When nothing fits, the table's batch-1 peaks and the one line below say it once.
        if fits and (not row.fit.fits or row.label.startswith("plan")):
            out.print(row.fit.message)
    if args.json:
        data = [row.to_dict() for row in rows]
        write_json(
            args.json, {"seconds": seconds, "compiles": w.compiles, "rows": data}, flag="--json"
        )
    if not fits:
        # Exit code 1: the search ran and found nothing that fits (README, "Exit codes").
        least = min(rows, key=lambda row: row.fit.peak_bytes)
        sys.stderr.write(
            f"remat-kit: nothing fits: even at batch {w.batch_multiple} the smallest peak is "
            f"{least.fit.peak_bytes / 2**30:.2f} GiB ({least.label}), over the "
            f"{least.fit.limit_bytes / 2**30:.2f} GiB limit on {target.name}; remat-kit plan "
            "--batch 1 for a per-tag plan, or remat-kit advise for a GPU\n"
        )
        return 1
    return 0


def _throughput(
    args: argparse.Namespace, run: Any, w: Any, policies: dict[str, Any], schedule: Any
) -> int:
    """``--objective throughput``: the fastest micro-batch per policy, the winner marked."""
    ways = w.batch_multiple
    if args.global_batch is not None and args.global_batch % ways:
        raise BadValue(
            f"--global-batch {args.global_batch} does not split over the {ways} data-parallel "
            f"GPUs; use a multiple of {ways}"
        )

    def accumulate(accum: int) -> Any:
        # The step is first built at one micro-batch per data-parallel GPU per pass (the
        # search sets the batch); it has to split into ``accum`` passes.
        config = dataclasses.replace(run.config, accum=accum, batch=accum * ways)
        return sources.workload(run.source, run.target, config)

    specs = [PLAN if pol is None else pol for pol in policies.values()]
    with warnings.catch_warnings(), progress("fit --objective throughput") as step:
        warnings.simplefilter("ignore")  # the table shows what matters
        found = fastest(
            w,
            specs,
            schedule,
            global_batch=args.global_batch,
            accumulate=accumulate,
            headroom=args.headroom,
            offload=not args.no_offload,
            hide=args.hide,
            progress=step,
        )
    out = console(args.wide)
    limit = limit_words(run.target, args.headroom)
    out.print(fitted(throughput_table(found, run.opts, limit_words=limit), out.width))
    out.print(fastest_words(found))
    if args.json:
        write_json(args.json, found.to_dict(), flag="--json")
    if not any(row.fits for row in found.rows):
        sys.stderr.write(f"remat-kit: nothing fits on {run.target.name}\n")
        return 1
    return 0
